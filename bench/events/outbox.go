package eventsbench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/events/outbox"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// outboxSetups are the states of the outbox Record is measured in: without its trigger
// (Record as it was before the outbox), with the trigger and no sink registered (nothing
// queued, but Postgres keeps the statement's transition table), and with one sink
// registered and no relay draining it (every event queued: the outbox filling).
var outboxSetups = []struct {
	name    string
	trigger bool
	sinks   []string
}{
	{"no outbox trigger", false, nil},
	{"trigger, no sink", true, nil},
	{"trigger, one sink (outbox filling)", true, []string{"bench"}},
}

// OutboxResult is one batch size's Record throughput in each outbox setup: medians over
// the rounds, in events per second, and each setup's throughput over the first's, as the
// median of the rounds' own ratios.
type OutboxResult struct {
	BatchSize int
	PerSecond []float64
	Ratios    []float64
	// Each is every round's ratios, per setup.
	Each [][]float64
	// CPU is each setup's CPU time per event, over all rounds.
	CPU []benchutil.CPUUse
}

// CompareOutbox measures Record through the service in each outbox setup, in rounds
// that run every setup back to back, rotating which goes first.
func CompareOutbox(ctx context.Context, o Options, pool *pgxpool.Pool, svc *service, progress io.Writer) ([]OutboxResult, error) {
	box := outbox.New(pool)
	defer func() {
		_, _ = pool.Exec(ctx, "DELETE FROM cloudevent_sinks")
		_, _ = pool.Exec(ctx, "ALTER TABLE action_events ENABLE TRIGGER queue_recorded_events")
	}()
	var results []OutboxResult
	for _, size := range o.BatchSizes {
		n := len(outboxSetups)
		rates, ratios := make([][]float64, n), make([][]float64, n)
		cpu := make([]benchutil.CPUUse, n)
		for round := range o.Rounds {
			fmt.Fprintf(progress, "Record and the outbox, batch %d, round %d\n", size, round+1)
			rate := make([]float64, n)
			for k := range n {
				i := (k + round) % n
				r, used, err := recordInSetup(ctx, o, pool, box, svc, i, size, fmt.Sprintf("o%d-%d-%d", size, round, i))
				if err != nil {
					return nil, fmt.Errorf("%s: %w", outboxSetups[i].name, err)
				}
				rate[i] = r
				cpu[i] = cpu[i].Add(used, 1)
			}
			for i := range n {
				rates[i] = append(rates[i], rate[i])
				ratios[i] = append(ratios[i], rate[i]/rate[0])
			}
		}
		r := OutboxResult{BatchSize: size, Each: ratios}
		for i := range n {
			r.PerSecond = append(r.PerSecond, benchutil.Median(rates[i]))
			r.Ratios = append(r.Ratios, benchutil.Median(ratios[i]))
			r.CPU = append(r.CPU, cpu[i].Per(o.Rounds*o.IngestEvents))
		}
		results = append(results, r)
	}
	return results, nil
}

// recordInSetup empties the tables, puts the outbox in setup i, and records the events
// of one round, returning events per second and the CPU time they took.
func recordInSetup(ctx context.Context, o Options, pool *pgxpool.Pool, box *outbox.Outbox, svc *service, i, size int, prefix string) (float64, benchutil.CPUUse, error) {
	setup := outboxSetups[i]
	if _, err := pool.Exec(ctx, "TRUNCATE event_outbox"); err != nil {
		return 0, nil, err
	}
	if err := truncate(ctx, pool); err != nil {
		return 0, nil, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE event_outbox"); err != nil {
		return 0, nil, err
	}
	toggle := "DISABLE"
	if setup.trigger {
		toggle = "ENABLE"
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE action_events "+toggle+" TRIGGER queue_recorded_events"); err != nil {
		return 0, nil, err
	}
	// Exactly the setup's sinks: none left from the setup before.
	if _, err := pool.Exec(ctx, "DELETE FROM cloudevent_sinks"); err != nil {
		return 0, nil, err
	}
	if _, err := box.AddSinks(ctx, setup.sinks); err != nil {
		return 0, nil, err
	}
	meter := benchutil.CPUMeter{Groups: map[string]func(benchutil.Proc) bool{}}
	if o.Postgres != nil {
		meter.Groups[postgresGroup] = o.Postgres
	}
	evs := generate(prefix, o.IngestEvents, 100)
	var d time.Duration
	used, err := meter.Measure(func() (err error) {
		d, err = fanOut(o.Clients, batches(evs, size), func(c int, b []*eventsv1.ActionEvent) error {
			_, err := svc.clients[c].Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
			return err
		})
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	// The setup must have held throughout: everything queued with a sink, nothing
	// without.
	var queued int
	if err := pool.QueryRow(ctx, "SELECT coalesce(sum(count), 0) FROM event_outbox").Scan(&queued); err != nil {
		return 0, nil, err
	}
	if want := len(setup.sinks) * len(evs); queued != min(want, len(evs)) {
		return 0, nil, fmt.Errorf("%d events queued; want %d", queued, min(want, len(evs)))
	}
	return float64(len(evs)) / d.Seconds(), used, nil
}

// WriteOutbox writes the comparison as Markdown.
func WriteOutbox(w io.Writer, o Options, results []OutboxResult) {
	fmt.Fprintf(w, "\n### Outbox cost on Record: %d events, %d clients, median of %d rounds (each runs every setup, rotating the first)\n\n", o.IngestEvents, o.Clients, o.Rounds)
	fmt.Fprintln(w, "| batch | setup | Record (events/s) | / no trigger (median of rounds) | each round | CPU per event: this process | CPU per event: Postgres | / no trigger, by CPU |")
	fmt.Fprintln(w, "| ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |")
	for _, r := range results {
		for i, s := range outboxSetups {
			var each []string
			for _, x := range r.Each[i] {
				each = append(each, fmt.Sprintf("%.0f%%", 100*x))
			}
			pgCPU, byCPU := "-", "-"
			if o.Postgres != nil {
				pgCPU = fmt.Sprintf("%.1fµs", micros(r.CPU[i][postgresGroup]))
				byCPU = fmt.Sprintf("%.0f%%", 100*float64(r.CPU[0].Total())/float64(r.CPU[i].Total()))
			}
			fmt.Fprintf(w, "| %d | %s | %.0f | %.0f%% | %s | %.1fµs | %s | %s |\n", r.BatchSize, s.name, r.PerSecond[i], 100*r.Ratios[i],
				strings.Join(each, " "), micros(r.CPU[i][benchutil.SelfGroup]), pgCPU, byCPU)
		}
	}
	if len(results) > 0 && results[0].CPU[0][postgresGroup] > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Every setup keeps the two cores busy, so the ratio of CPU per event (the last column) predicts the")
		fmt.Fprintln(w, "ratio of throughputs with less of the noise a shared machine adds to the measured rates.")
	}
}
