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
	"github.com/flytekube/backend/internal/pgtest"
)

func main() {
	o := bench.Options{}
	var sizes string
	flag.StringVar(&o.DatabaseURL, "database-url", "", "Postgres to use (its tables are truncated); default: a throwaway cluster")
	flag.IntVar(&o.Clients, "clients", 8, "concurrent clients")
	flag.IntVar(&o.IngestEvents, "ingest-events", 200_000, "events per ingest run")
	flag.StringVar(&sizes, "batches", "100,500", "Record batch sizes")
	flag.IntVar(&o.Rounds, "rounds", 3, "ingest rounds per batch size (median reported)")
	flag.IntVar(&o.StoredEvents, "stored-events", 1_000_000, "store size for query latencies")
	flag.IntVar(&o.Queries, "queries", 5000, "calls per query latency")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (client and service) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		stop, err := benchutil.StartCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "events-bench:", err)
			os.Exit(1)
		}
		defer stop()
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1000 {
			fmt.Fprintf(os.Stderr, "events-bench: --batches: %q is not a batch size from 1 to 1000\n", s)
			os.Exit(2)
		}
		o.BatchSizes = append(o.BatchSizes, n)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "events-bench:", err)
		os.Exit(1) //nolint:gocritic // the profile of a failed run is not wanted
	}
}

func run(o bench.Options) error {
	if o.DatabaseURL == "" {
		pg, err := pgtest.Start()
		if err != nil {
			return err
		}
		defer func() { _ = pg.Stop() }()
		o.DatabaseURL = pg.URL
	}
	return bench.Run(context.Background(), o, os.Stdout, os.Stderr)
}
