// Command events-bench measures the events service against baselines taken in the same
// run and prints a Markdown report (see docs/benchmarks.md). Without --database-url it
// starts a throwaway Postgres with hack/postgres.sh.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/flytekube/backend/events/bench"
	"github.com/flytekube/backend/internal/benchutil"
)

func main() {
	o := bench.Options{BatchSizes: []int{100, 500}}
	flag.StringVar(&o.DatabaseURL, "database-url", "", "Postgres to use (its tables are truncated); default: a throwaway cluster")
	flag.IntVar(&o.Clients, "clients", 8, "concurrent clients")
	flag.IntVar(&o.IngestEvents, "ingest-events", 200_000, "events per ingest run")
	flag.Func("batches", "Record batch sizes, comma-separated (default 100,500)", func(v string) error {
		o.BatchSizes = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > 1000 {
				return fmt.Errorf("%q is not a batch size from 1 to 1000", s)
			}
			o.BatchSizes = append(o.BatchSizes, n)
		}
		return nil
	})
	flag.IntVar(&o.Rounds, "rounds", 3, "ingest rounds per batch size (median reported)")
	flag.IntVar(&o.StoredEvents, "stored-events", 1_000_000, "store size for query latencies")
	flag.IntVar(&o.Queries, "queries", 5000, "calls per query latency")
	flag.BoolVar(&o.CompareAuth, "compare-auth", true, "also measure Record with auth mode kubernetes (an API server built by hack/envtest.sh) beside auth mode none")
	flag.BoolVar(&o.CompareOutbox, "compare-outbox", true, "also measure Record with the CloudEvents outbox's trigger, without and with a sink registered, beside Record without it")
	benchutil.Main("events-bench", func() error {
		return benchutil.WithDatabase(o.DatabaseURL, func(url string, postgres func(benchutil.Proc) bool) error {
			o.DatabaseURL, o.Postgres = url, postgres
			return bench.Run(context.Background(), o, os.Stdout, os.Stderr)
		})
	})
}
