// Command cache-bench measures the cache service against a baseline taken in the same
// run and prints a Markdown report (see docs/benchmarks.md). Without --database-url it
// starts a throwaway Postgres with hack/postgres.sh.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/flytekube/backend/bench/benchutil"
	cachebench "github.com/flytekube/backend/bench/cacheservice"
)

func main() {
	var o cachebench.Options
	flag.StringVar(&o.DatabaseURL, "database-url", "", "Postgres to use (its cache tables are truncated); default: a throwaway cluster")
	flag.IntVar(&o.Entries, "entries", 100_000, "cache entries stored")
	flag.IntVar(&o.Clients, "clients", 16, "concurrent Get clients")
	flag.DurationVar(&o.Duration, "duration", 5*time.Second, "length of each measurement")
	flag.IntVar(&o.Rounds, "rounds", 3, "rounds per Get measurement (median reported)")
	flag.IntVar(&o.ReservationClients, "reservation-clients", 64, "concurrent GetOrExtendReservation clients")
	flag.IntVar(&o.ReservationKeys, "reservation-keys", 100, "keys they contend for")
	flag.BoolVar(&o.CompareAuth, "compare-auth", true, "also measure Get hits with auth mode kubernetes (an API server built by hack/envtest.sh) beside auth mode none")
	flag.Func("only", "run one part only: "+strings.Join(cachebench.Parts, ", "), func(v string) error {
		if !slices.Contains(cachebench.Parts, v) {
			return fmt.Errorf("not one of %s", strings.Join(cachebench.Parts, ", "))
		}
		o.Only = v
		return nil
	})
	benchutil.Main("cache-bench", func() error {
		return benchutil.WithDatabase(o.DatabaseURL, func(url string, postgres func(benchutil.Proc) bool) error {
			o.DatabaseURL, o.Postgres = url, postgres
			return cachebench.Run(context.Background(), o, os.Stdout, os.Stderr)
		})
	})
}
