// Package eventsbench measures the events service against a baseline taken in the same run,
// because absolute figures on shared machines mean little:
//
//   - ingest: Record throughput (8 clients over real HTTP/2, batches of 100 and 500)
//     beside the ceiling of the same rows written with pgx CopyFrom into the same table;
//   - queries: GetAction, ListActions and ListActionEvents latency over a large store;
//   - egress (egress.go): CloudEvents publish throughput per sink, Record's maximum rate
//     without and with sinks, lag at half of it, and a slow sink against none;
//   - migration (migration.go): the store's migration from the previous release's
//     schema while that release serves, with how long its calls waited and which failed.
package eventsbench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/client-go/kubernetes"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
)

// Options size the run.
type Options struct {
	DatabaseURL string
	// Postgres chooses the database's processes, so that their CPU time is reported
	// beside this process's; nil when unknown (a database given by URL).
	Postgres func(benchutil.Proc) bool
	// Clients is the number of concurrent writers and readers.
	Clients int
	// IngestEvents is the number of events per ingest measurement.
	IngestEvents int
	// BatchSizes are the Record batch sizes to measure.
	BatchSizes []int
	// CompareAuth also measures Record with auth mode kubernetes beside auth mode none.
	CompareAuth bool
	// CompareOutbox also measures Record with the outbox's trigger, without and with a
	// sink registered, beside Record without the trigger.
	CompareOutbox bool
	// Rounds repeats each ingest measurement, alternating baseline and service; the
	// median is reported.
	Rounds int
	// StoredEvents is the store size for the query latencies.
	StoredEvents int
	// Queries is the number of calls per query latency.
	Queries int
	// Egress also measures CloudEvents egress (egress.go), once the other parts are done.
	Egress bool
	// EgressSize sizes it.
	EgressSize EgressSize
	// ScaleSize sizes the scale part (scale.go).
	ScaleSize ScaleSize
	// NotifyClients, NotifyBatch and NotifyEvents size the notify part (scale.go).
	NotifyClients, NotifyBatch, NotifyEvents int
	// MigrationSize sizes the migration part (migration.go).
	MigrationSize MigrationSize
	// Only runs one part: "ingest" (with its comparisons), "queries", "egress", "scale" or
	// "notify"; empty runs the first three.
	Only string
}

// Parts are the values Options.Only takes.
var Parts = []string{"ingest", "queries", "egress", "scale", "notify", "migration"}

// runs says whether the run includes part.
func (o Options) runs(part string) bool { return o.Only == "" || o.Only == part }

// phases is the life of one benchmark action: five events.
var phases = []struct {
	phase   flytecorev1.ActionPhase
	version uint32
}{
	{flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, 0},
	{flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING, 0},
	{flytecorev1.ActionPhase_ACTION_PHASE_RUNNING, 0},
	{flytecorev1.ActionPhase_ACTION_PHASE_RUNNING, 1},
	{flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED, 0},
}

// generate makes n events: actions of runsOf actions per run, five events each, named
// with prefix so that rounds do not collide.
func generate(prefix string, n, actionsPerRun int) []*eventsv1.ActionEvent {
	return generateFrom(prefix, 0, n, actionsPerRun)
}

// generateFrom is generate starting at the first-th action (from 0), so that a store
// can be grown in steps.
func generateFrom(prefix string, first, n, actionsPerRun int) []*eventsv1.ActionEvent {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]*eventsv1.ActionEvent, 0, n)
	for i := first; len(out) < n; i++ {
		id := &flytecorev1.ActionIdentifier{
			Project: "bench", Domain: "development",
			Run:    fmt.Sprintf("%s-r%d", prefix, i/actionsPerRun),
			Action: fmt.Sprintf("a%d", i%actionsPerRun),
		}
		for j, p := range phases {
			if len(out) == n {
				break
			}
			out = append(out, &eventsv1.ActionEvent{
				Id: id, Attempt: 1, Phase: p.phase, Version: p.version,
				OccurredAt: timestamppb.New(start.Add(time.Duration(i*10+j) * time.Millisecond)),
				ReportedAt: timestamppb.New(start.Add(time.Duration(i*10+j+1) * time.Millisecond)),
				Cluster:    "bench-cluster", TaskType: "container",
				Reason: "BenchmarkPhase", Message: "a phase change of a benchmark action, of typical length",
			})
		}
	}
	return out
}

func batches(evs []*eventsv1.ActionEvent, size int) [][]*eventsv1.ActionEvent {
	var out [][]*eventsv1.ActionEvent
	for len(evs) > 0 {
		n := min(size, len(evs))
		out = append(out, evs[:n])
		evs = evs[n:]
	}
	return out
}

// fanOut runs work on the batches from clients goroutines and returns the elapsed time.
func fanOut(clients int, bs [][]*eventsv1.ActionEvent, work func(client int, batch []*eventsv1.ActionEvent) error) (time.Duration, error) {
	next := make(chan []*eventsv1.ActionEvent, len(bs))
	for _, b := range bs {
		next <- b
	}
	close(next)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for b := range next {
				if err := work(c, b); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), first
}

// IngestResult is one batch size's figures: medians over the rounds, in events per
// second.
type IngestResult struct {
	BatchSize       int
	CopyPerSecond   float64
	RecordPerSecond float64
	// Ratio is the median of each round's Record throughput over the same round's
	// ceiling: the two are measured back to back, so a round's ratio is less exposed to
	// the machine's drift than the ratio of the two medians.
	Ratio float64
	// Ratios are the rounds' ratios, in the order they ran.
	Ratios []float64
	// CeilingCPU and RecordCPU are the CPU time per event of each way, over all rounds:
	// this process's (clients, and the service for Record) and Postgres's (postgresGroup).
	CeilingCPU, RecordCPU benchutil.CPUUse
	// ValidateCPU is what protovalidate alone costs per event: the same batches checked
	// by one goroutine, outside any RPC.
	ValidateCPU time.Duration
}

// copyRows writes the batch the cheapest way Postgres offers: COPY, no conflict
// handling, no fold. The rows are filed at the present, as Record files a new action's
// events, so they go to the present's partition; without a filing they would go to the
// partition of the previous release's events, whose trigger files each one (migration
// 00010), which cost the ceiling three times what Record costs. Where the schema has the
// event's cluster (from 00013 on), the rows carry it, as Record's do; without it v0.3.0's
// trigger for the previous release's events (00017) would look each one's up.
func copyRows(ctx context.Context, pool *pgxpool.Pool, batch []*eventsv1.ActionEvent, withCluster bool) error {
	filed := time.Now()
	rows := make([][]any, len(batch))
	for i, e := range batch {
		b, err := proto.Marshal(e)
		if err != nil {
			return err
		}
		id := e.GetId()
		rows[i] = []any{id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction(),
			int32(e.GetAttempt()), int16(e.GetPhase()), int32(e.GetVersion()), e.GetOccurredAt().AsTime(), b, filed}
		if withCluster {
			rows[i] = append(rows[i], e.GetCluster())
		}
	}
	columns := []string{"project", "domain", "run", "action", "attempt", "phase", "version", "occurred_at", "event", "filed_at"}
	if withCluster {
		columns = append(columns, "cluster")
	}
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"action_events"}, columns, pgx.CopyFromRows(rows))
	return err
}

func truncate(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, "TRUNCATE action_events, actions")
	if err == nil {
		_, err = pool.Exec(ctx, "VACUUM ANALYZE action_events, actions")
	}
	return err
}

// service runs the events service in-process, as its binary does.
type service struct {
	clients []eventsv1connect.EventsServiceClient
	stop    func() error
}

func startService(ctx context.Context, o Options) (*service, error) {
	return startServiceWith(ctx, o, auth.Config{Mode: auth.ModeNone}, nil, "")
}

// startServiceWith runs the service with authCfg (kube reaching the API server of mode
// kubernetes); its clients send token when it is not empty.
func startServiceWith(ctx context.Context, o Options, authCfg auth.Config, kube kubernetes.Interface, token string) (*service, error) {
	cfg := events.Config{Listen: "127.0.0.1:0", DatabaseURL: o.DatabaseURL, Auth: authCfg, KubeClient: kube}
	url, stop, err := benchutil.StartService(ctx, events.Run, cfg)
	if err != nil {
		return nil, err
	}
	s := &service{stop: stop}
	for _, h := range benchutil.Clients(o.Clients, token) {
		s.clients = append(s.clients, eventsv1connect.NewEventsServiceClient(h, url))
	}
	return s, nil
}

// Ingest measures each batch size.
func Ingest(ctx context.Context, o Options, pool *pgxpool.Pool, svc *service) ([]IngestResult, error) {
	var results []IngestResult
	for _, size := range o.BatchSizes {
		var copies, records, ratios []float64
		ceilingCPU, recordCPU, validateCPU := benchutil.CPUUse{}, benchutil.CPUUse{}, benchutil.CPUUse{}
		meter := benchutil.CPUMeter{Groups: map[string]func(benchutil.Proc) bool{}}
		if o.Postgres != nil {
			meter.Groups[postgresGroup] = o.Postgres
		}
		// measure runs one phase and adds its CPU time to total.
		measure := func(total *benchutil.CPUUse, phase func() (time.Duration, error)) (d time.Duration, err error) {
			used, err := meter.Measure(func() (err error) {
				d, err = phase()
				return err
			})
			*total = total.Add(used, 1)
			return d, err
		}
		for round := range o.Rounds {
			evs := generate(fmt.Sprintf("b%d-%d", size, round), o.IngestEvents, 100)
			bs := batches(evs, size)

			if err := truncate(ctx, pool); err != nil {
				return nil, err
			}
			var withCluster bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM information_schema.columns
				WHERE table_name = 'action_events' AND column_name = 'cluster' AND table_schema = current_schema())`).Scan(&withCluster); err != nil {
				return nil, err
			}
			d, err := measure(&ceilingCPU, func() (time.Duration, error) {
				return fanOut(o.Clients, bs, func(_ int, b []*eventsv1.ActionEvent) error { return copyRows(ctx, pool, b, withCluster) })
			})
			if err != nil {
				return nil, fmt.Errorf("copy: %w", err)
			}
			copies = append(copies, float64(len(evs))/d.Seconds())

			if err := truncate(ctx, pool); err != nil {
				return nil, err
			}
			d, err = measure(&recordCPU, func() (time.Duration, error) {
				return fanOut(o.Clients, bs, func(c int, b []*eventsv1.ActionEvent) error {
					resp, err := svc.clients[c].Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
					if err == nil && int(resp.Msg.GetRecorded()) != len(b) {
						err = fmt.Errorf("recorded %d of %d new events", resp.Msg.GetRecorded(), len(b))
					}
					return err
				})
			})
			if err != nil {
				return nil, fmt.Errorf("record: %w", err)
			}
			if _, err := measure(&validateCPU, func() (time.Duration, error) {
				for _, b := range bs {
					if err := protovalidate.Validate(&eventsv1.RecordRequest{Events: b}); err != nil {
						return 0, fmt.Errorf("validating: %w", err)
					}
				}
				return 0, nil
			}); err != nil {
				return nil, err
			}
			records = append(records, float64(len(evs))/d.Seconds())
			ratios = append(ratios, records[round]/copies[round])
		}
		results = append(results, IngestResult{
			BatchSize: size, CopyPerSecond: benchutil.Median(copies), RecordPerSecond: benchutil.Median(records),
			Ratio: benchutil.Median(ratios), Ratios: ratios,
			CeilingCPU: ceilingCPU.Per(o.Rounds * o.IngestEvents), RecordCPU: recordCPU.Per(o.Rounds * o.IngestEvents),
			ValidateCPU: validateCPU.Per(o.Rounds * o.IngestEvents)[benchutil.SelfGroup],
		})
	}
	return results, nil
}

// postgresGroup names Postgres's processes in the CPU readings.
const postgresGroup = "Postgres"

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Latency is one query's latency distribution.
type Latency struct {
	Query    string
	P50, P99 time.Duration
	Calls    int
}

// Queries fills the store to o.StoredEvents through Record and measures query latency
// from o.Clients concurrent clients.
func Queries(ctx context.Context, o Options, pool *pgxpool.Pool, svc *service, progress io.Writer) ([]Latency, error) {
	if err := truncate(ctx, pool); err != nil {
		return nil, err
	}
	const actionsPerRun = 200
	evs := generate("q", o.StoredEvents, actionsPerRun)
	start := time.Now()
	if _, err := fanOut(o.Clients, batches(evs, 1000), func(c int, b []*eventsv1.ActionEvent) error {
		_, err := svc.clients[c].Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
		return err
	}); err != nil {
		return nil, fmt.Errorf("loading: %w", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE action_events, actions"); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "loaded %d events in %s\n", len(evs), time.Since(start).Round(time.Second))

	return measureQueries(ctx, o, svc, "q", len(evs)/len(phases), actionsPerRun)
}

// measureQueries measures each query from o.Clients concurrent clients over a store
// holding actions actions named by generateFrom(prefix, 0, ...).
func measureQueries(ctx context.Context, o Options, svc *service, prefix string, actions, actionsPerRun int) ([]Latency, error) {
	runs := actions / actionsPerRun
	idOf := func(i int) *flytecorev1.ActionIdentifier {
		i = (i * 7919) % actions // spread over the whole key space
		return &flytecorev1.ActionIdentifier{Project: "bench", Domain: "development", Run: fmt.Sprintf("%s-r%d", prefix, i/actionsPerRun), Action: fmt.Sprintf("a%d", i%actionsPerRun)}
	}
	queries := []struct {
		name string
		call func(c eventsv1connect.EventsServiceClient, i int) error
	}{
		{"GetAction", func(c eventsv1connect.EventsServiceClient, i int) error {
			_, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: idOf(i)}))
			return err
		}},
		{"ListActions, project and domain, first page of 100", func(c eventsv1connect.EventsServiceClient, _ int) error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "bench", Domain: "development", PageSize: 100}))
			return err
		}},
		{fmt.Sprintf("ListActions, one run (%d actions), page of 100", actionsPerRun), func(c eventsv1connect.EventsServiceClient, i int) error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "bench", Domain: "development", Run: fmt.Sprintf("%s-r%d", prefix, (i*31)%runs), PageSize: 100}))
			return err
		}},
		{"ListActions, phase filter, first page of 100", func(c eventsv1connect.EventsServiceClient, _ int) error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "bench", Domain: "development", Phase: flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED, PageSize: 100}))
			return err
		}},
		{"ListActionEvents (5 events)", func(c eventsv1connect.EventsServiceClient, i int) error {
			resp, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: idOf(i)}))
			if err == nil && len(resp.Msg.GetEvents()) != len(phases) {
				err = fmt.Errorf("%v lists %d events; want %d", idOf(i), len(resp.Msg.GetEvents()), len(phases))
			}
			return err
		}},
	}
	var out []Latency
	for _, q := range queries {
		lat := make([]time.Duration, o.Queries)
		next := make(chan int, o.Queries)
		for i := range o.Queries {
			next <- i
		}
		close(next)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			first error
		)
		for c := range o.Clients {
			wg.Go(func() {
				for i := range next {
					t := time.Now()
					err := q.call(svc.clients[c], i)
					lat[i] = time.Since(t)
					if err != nil {
						mu.Lock()
						first = err
						mu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
		if first != nil {
			return nil, fmt.Errorf("%s: %w", q.name, first)
		}
		out = append(out, Latency{Query: q.name, P50: benchutil.Percentile(lat, 0.5), P99: benchutil.Percentile(lat, 0.99), Calls: o.Queries})
	}
	return out, nil
}

// Run performs every measurement and writes a Markdown report to w.
func Run(ctx context.Context, o Options, w io.Writer, progress io.Writer) error {
	pool, err := benchutil.OpenMigrated(ctx, o.DatabaseURL, store.Migrations())
	if err != nil {
		return err
	}
	defer pool.Close()
	if o.runs("ingest") || o.runs("queries") {
		if err := runService(ctx, o, pool, w, progress); err != nil {
			return err
		}
	}
	switch o.Only {
	case "scale":
		r, err := Scale(ctx, o, pool, progress)
		if err != nil {
			return fmt.Errorf("scale: %w", err)
		}
		WriteScale(w, o, r)
		return nil
	case "notify":
		r, err := Notify(ctx, o, pool, progress)
		if err != nil {
			return fmt.Errorf("notify: %w", err)
		}
		WriteNotify(w, o, r)
		return nil
	case "migration":
		r, err := Migration(ctx, o, progress)
		WriteMigration(w, o, r)
		if err != nil {
			return fmt.Errorf("migration: %w", err)
		}
		return nil
	}
	if o.Only == "egress" || (o.Only == "" && o.Egress) {
		// After the service above has stopped: its relay would lead, and unregister
		// the sinks the egress part's services publish to.
		r, err := Egress(ctx, o, pool, progress)
		if err != nil {
			return fmt.Errorf("egress: %w", err)
		}
		WriteEgress(w, o, r)
	}
	return nil
}

// runService runs the parts that share one events service without sinks: ingest, with
// its comparisons, and queries.
func runService(ctx context.Context, o Options, pool *pgxpool.Pool, w io.Writer, progress io.Writer) error {
	svc, err := startService(ctx, o)
	if err != nil {
		return err
	}
	defer func() { _ = svc.stop() }()
	if o.runs("ingest") {
		if err := runIngest(ctx, o, pool, svc, w, progress); err != nil {
			return err
		}
	}
	if o.runs("queries") {
		return runQueries(ctx, o, pool, svc, w, progress)
	}
	return nil
}

// runIngest measures ingest and its comparisons.
func runIngest(ctx context.Context, o Options, pool *pgxpool.Pool, svc *service, w io.Writer, progress io.Writer) error {
	fmt.Fprintf(progress, "ingest: %d events per run, batches %v, %d clients, %d rounds\n", o.IngestEvents, o.BatchSizes, o.Clients, o.Rounds)
	ingest, err := Ingest(ctx, o, pool, svc)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "### Ingest: %d events, %d concurrent clients, median of %d rounds\n\n", o.IngestEvents, o.Clients, o.Rounds)
	fmt.Fprintln(w, "| batch | ceiling: pgx CopyFrom (events/s) | Record over HTTP/2 (events/s) | Record / ceiling (median of rounds) | each round |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | --- |")
	for _, r := range ingest {
		var each []string
		for _, x := range r.Ratios {
			each = append(each, fmt.Sprintf("%.0f%%", 100*x))
		}
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %.0f%% | %s |\n", r.BatchSize, r.CopyPerSecond, r.RecordPerSecond, 100*r.Ratio, strings.Join(each, " "))
	}
	if o.Postgres != nil {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "CPU time per event, over all rounds. \"This process\" is the clients, and for Record the service too;")
		fmt.Fprintln(w, "both ways keep the machine's cores busy, so the ratio of their CPU per event predicts the ratio of")
		fmt.Fprintln(w, "their throughputs. protovalidate is the same batches checked by one goroutine outside any RPC.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| batch | ceiling: this process | ceiling: Postgres | Record: this process | Record: Postgres | ceiling / Record, by CPU | protovalidate alone | ceiling / Record, by CPU, without protovalidate's |")
		fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, r := range ingest {
			ceiling, record := r.CeilingCPU.Total(), r.RecordCPU.Total()
			fmt.Fprintf(w, "| %d | %.1fµs | %.1fµs | %.1fµs | %.1fµs | %.0f%% | %.1fµs | %.0f%% |\n", r.BatchSize,
				micros(r.CeilingCPU[benchutil.SelfGroup]), micros(r.CeilingCPU[postgresGroup]),
				micros(r.RecordCPU[benchutil.SelfGroup]), micros(r.RecordCPU[postgresGroup]),
				100*float64(ceiling)/float64(record), micros(r.ValidateCPU), 100*float64(ceiling)/float64(record-r.ValidateCPU))
		}
	}

	if o.CompareOutbox {
		r, err := CompareOutbox(ctx, o, pool, svc, progress)
		if err != nil {
			return fmt.Errorf("outbox comparison: %w", err)
		}
		WriteOutbox(w, o, r)
	}

	if o.CompareAuth {
		r, err := CompareAuth(ctx, o, pool, svc, progress)
		if err != nil {
			return fmt.Errorf("auth comparison: %w", err)
		}
		WriteAuth(w, o, r)
	}
	return nil
}

// runQueries measures query latency.
func runQueries(ctx context.Context, o Options, pool *pgxpool.Pool, svc *service, w io.Writer, progress io.Writer) error {
	fmt.Fprintf(progress, "queries: loading %d events\n", o.StoredEvents)
	lats, err := Queries(ctx, o, pool, svc, progress)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n### Query latency: %d stored events (%d actions), %d concurrent clients, %d calls each\n\n", o.StoredEvents, o.StoredEvents/len(phases), o.Clients, o.Queries)
	fmt.Fprintln(w, "| query | p50 | p99 |")
	fmt.Fprintln(w, "| --- | ---: | ---: |")
	for _, l := range lats {
		fmt.Fprintf(w, "| %s | %s | %s |\n", l.Query, l.P50.Round(10*time.Microsecond), l.P99.Round(10*time.Microsecond))
	}
	return nil
}
