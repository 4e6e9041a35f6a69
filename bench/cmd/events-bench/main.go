// Command events-bench measures the events service against baselines taken in the same
// run and prints a Markdown report (see docs/benchmarks.md). Without --database-url it
// starts a throwaway Postgres with hack/postgres.sh.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flytekube/backend/bench/benchutil"
	eventsbench "github.com/flytekube/backend/bench/events"
)

func main() {
	o := eventsbench.Options{BatchSizes: []int{100, 500}}
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
	flag.BoolVar(&o.Egress, "egress", true, "also measure CloudEvents egress (publish throughput per sink, lag at half of Record's maximum rate, a slow sink against none) with an HTTP receiver, an embedded NATS JetStream and kfake in this process")
	flag.Func("only", "run one part only: "+strings.Join(eventsbench.Parts, ", ")+" (ingest includes --compare-outbox and --compare-auth)", func(v string) error {
		if !slices.Contains(eventsbench.Parts, v) {
			return fmt.Errorf("%q is not one of %s", v, strings.Join(eventsbench.Parts, ", "))
		}
		o.Only = v
		return nil
	})
	flag.IntVar(&o.EgressSize.Batch, "egress-batch", 100, "events per Record in the egress part")
	flag.IntVar(&o.EgressSize.Backlog, "egress-backlog", 50_000, "events recorded before the relay drains them, per publish measurement")
	flag.DurationVar(&o.EgressSize.MaxFor, "egress-max-for", 10*time.Second, "how long Record runs flat out per setup and round, for its maximum rate")
	flag.DurationVar(&o.EgressSize.PacedFor, "egress-paced-for", 20*time.Second, "how long Record runs at half its maximum rate, for the lag")
	flag.Float64Var(&o.EgressSize.PacedRate, "egress-paced-rate", 0, "events per second of the paced run (default: half of Record's maximum rate with the sinks)")
	flag.Func("egress-sinks", "the sinks of the egress part's maximum rate and lag, comma-separated: "+strings.Join(eventsbench.SinkKinds, ", ")+" (default all three)", func(v string) error {
		for _, s := range strings.Split(v, ",") {
			if !slices.Contains(eventsbench.SinkKinds, s) {
				return fmt.Errorf("%q is not one of %s", s, strings.Join(eventsbench.SinkKinds, ", "))
			}
			o.EgressSize.Sinks = append(o.EgressSize.Sinks, s)
		}
		return nil
	})
	flag.StringVar(&o.EgressSize.HTTPMode, "egress-http-mode", "binary", "the HTTP sinks' content mode: binary, structured or batch (an array of up to 100 events per request)")
	flag.IntVar(&o.EgressSize.SlowEvents, "egress-slow-events", 150_000, "events recorded per setup and round beside a slow sink")
	flag.DurationVar(&o.EgressSize.SlowDelay, "egress-slow-delay", 50*time.Millisecond, "how long the slow HTTP sink takes to answer")
	flag.DurationVar(&o.EgressSize.DrainTimeout, "egress-drain-timeout", 3*time.Minute, "how long to wait for a consumer to hold every event")
	o.ScaleSize.Stored = []int{1_000_000, 5_000_000, 20_000_000}
	flag.Func("scale-stored", "store sizes of the scale part, in events, comma-separated, smallest first (default 1000000,5000000,20000000)", func(v string) error {
		o.ScaleSize.Stored = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || (len(o.ScaleSize.Stored) > 0 && n <= o.ScaleSize.Stored[len(o.ScaleSize.Stored)-1]) {
				return fmt.Errorf("%q is not a size larger than the one before", s)
			}
			o.ScaleSize.Stored = append(o.ScaleSize.Stored, n)
		}
		return nil
	})
	flag.IntVar(&o.ScaleSize.EventsPerDay, "scale-events-per-day", 5_000_000, "events one day's partition holds in the scale part (a million actions of five events)")
	flag.IntVar(&o.ScaleSize.RecordEvents, "scale-record-events", 100_000, "new events per Record measurement in the scale part")
	flag.IntVar(&o.NotifyClients, "notify-clients", 16, "concurrent writers in the notify part")
	flag.IntVar(&o.NotifyBatch, "notify-batch", 10, "events per Record in the notify part")
	flag.IntVar(&o.NotifyEvents, "notify-events", 50_000, "events per round in the notify part")
	o.MigrationSize.Stored = []int{2_000_000, 20_000_000}
	flag.Func("migration-stored", "store sizes of the migration part, in events, comma-separated (default 2000000,20000000)", func(v string) error {
		o.MigrationSize.Stored = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 5 {
				return fmt.Errorf("%q is not a number of events", s)
			}
			o.MigrationSize.Stored = append(o.MigrationSize.Stored, n)
		}
		return nil
	})
	flag.Float64Var(&o.MigrationSize.Rate, "migration-rate", 200, "events per second the previous release's events service records during the migration part")
	flag.StringVar(&o.MigrationSize.Release, "migration-release", "v0.1.0", "the release (in RELEASES) serving during the migration part; built from its commit once")
	flag.DurationVar(&o.MigrationSize.Settle, "migration-settle", 5*time.Second, "how long the previous release serves the load before the migration part's migration, and again after it")
	flag.StringVar(&o.MigrationSize.Dir, "migration-dir", "", "a directory of migration files the migration part runs instead of the tree's (another design, for comparison)")
	durable := flag.Bool("durable", false, "run the throwaway Postgres with fsync and synchronous commit on, as a deployment would (the notify part's setting)")
	benchutil.Main("events-bench", func() error {
		if *durable {
			if err := os.Setenv("FLYTE_PG_DURABLE", "full"); err != nil {
				return err
			}
		}
		return benchutil.WithDatabase(o.DatabaseURL, func(url string, postgres func(benchutil.Proc) bool) error {
			o.DatabaseURL, o.Postgres = url, postgres
			return eventsbench.Run(context.Background(), o, os.Stdout, os.Stderr)
		})
	})
}
