// Command console-bench measures how fast the events service's web console loads in
// Debian's Chromium, headless, against a static page of the same size loaded in the
// same run, and prints a Markdown report (see docs/benchmarks.md). Without
// --database-url it starts a throwaway Postgres with hack/postgres.sh.
package main

import (
	"context"
	"flag"
	"os"

	"github.com/flytekube/backend/bench/benchutil"
	consolebench "github.com/flytekube/backend/bench/console"
)

func main() {
	var o consolebench.Options
	flag.StringVar(&o.DatabaseURL, "database-url", "", "Postgres to use (its events tables are truncated); default: a throwaway cluster")
	flag.IntVar(&o.Samples, "samples", 30, "loads of each view and of its baseline (median and p95 reported)")
	flag.IntVar(&o.Runs, "runs", 50, "runs recorded, all in one project and domain")
	flag.IntVar(&o.ActionsPerRun, "actions", 20, "actions per run (at least 11)")
	benchutil.Main("console-bench", func() error {
		return benchutil.WithDatabase(o.DatabaseURL, func(url string, _ func(benchutil.Proc) bool) error {
			o.DatabaseURL = url
			return consolebench.Run(context.Background(), o, os.Stdout, os.Stderr)
		})
	})
}
