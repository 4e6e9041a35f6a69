// Command cache-migration-bench measures the cache store's migrations from v0.1.0's
// schema at a million entries while v0.1.0's cache service (built from its commit) serves
// Gets and Puts, and prints a Markdown report (see docs/benchmarks.md). Without
// --database-url it starts a throwaway Postgres with hack/postgres.sh.
package main

import (
	"context"
	"flag"
	"os"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/bench/cachemigration"
)

func main() {
	var o cachemigration.Options
	flag.StringVar(&o.DatabaseURL, "database-url", "", "an empty Postgres database to use; default: a throwaway cluster")
	flag.IntVar(&o.Entries, "entries", 1_000_000, "entries the table holds when the migrations start")
	flag.IntVar(&o.Clients, "clients", 8, "clients calling v0.1.0's service throughout, half Get, half Put")
	flag.BoolVar(&o.Previous, "previous", false, "apply the migration as it was before it was split (one transaction, its index built in it), for comparison")
	flag.DurationVar(&o.LockTimeout, "lock-timeout", 0, "the runner's lock_timeout (default 2s)")
	benchutil.Main("cache-migration-bench", func() error {
		return benchutil.WithDatabase(o.DatabaseURL, func(url string, _ func(benchutil.Proc) bool) error {
			o.DatabaseURL = url
			return cachemigration.Run(context.Background(), o, os.Stdout, os.Stderr)
		})
	})
}
