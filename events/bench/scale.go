package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/flytekube/backend/events/store"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/internal/benchutil"
)

// The scale part grows one store through the sizes of ScaleSize.Stored and, at each,
// measures the queries and Record's throughput against the same figures at the first
// size; then it drops the oldest day's partition. The store is filled a day at a time
// (EventsPerDay, a million actions a day by default) through the store itself, with a
// clock that files each day's actions on a day of its own, so that the store has the
// partitions a deployment would; Record and the queries are measured through the
// service, as clients call it.

// ScaleSize sizes the scale part.
type ScaleSize struct {
	// Stored are the store sizes to measure at, in events, smallest first.
	Stored []int
	// EventsPerDay is how many events one day's partition holds.
	EventsPerDay int
	// RecordEvents is how many new events each Record measurement writes.
	RecordEvents int
}

// ScalePoint is the figures at one store size.
type ScalePoint struct {
	Stored     int
	Partitions int
	Queries    []Latency
	// RecordPerSecond is Record's throughput per batch size (median of the rounds).
	RecordPerSecond map[int]float64
}

// ScaleResult is the scale part's figures.
type ScaleResult struct {
	Points []ScalePoint
	// Dropped is what dropping the expired partitions cost, oldest first, with the
	// events each held.
	Dropped []DroppedDay
}

// DroppedDay is one dropped partition with its events.
type DroppedDay struct {
	store.DroppedPartition
	Events int
}

const scaleActionsPerRun = 200

// Scale runs the scale part on a fresh store.
func Scale(ctx context.Context, o Options, pool *pgxpool.Pool, progress io.Writer) (*ScaleResult, error) {
	if err := truncate(ctx, pool); err != nil {
		return nil, err
	}
	svc, err := startService(ctx, o)
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.stop() }()
	// The days of the load come after the service's present, which the first partitions
	// already cover.
	firstDay := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, store.DefaultPartitionsAhead+2)
	clk := clocktesting.NewFakeClock(firstDay)
	loader := store.New(pool, store.Options{Clock: clk})

	res := &ScaleResult{}
	loaded := 0
	for _, size := range o.ScaleSize.Stored {
		for loaded < size {
			day := loaded / o.ScaleSize.EventsPerDay
			n := min(size, (day+1)*o.ScaleSize.EventsPerDay) - loaded
			when := firstDay.AddDate(0, 0, day).Add(time.Hour)
			clk.SetTime(when)
			if _, err := loader.MaintainPartitions(ctx, when); err != nil {
				return nil, err
			}
			start := time.Now()
			evs := generateFrom("s", loaded/len(phases), n, scaleActionsPerRun)
			if _, err := fanOut(o.Clients, batches(evs, 1000), func(_ int, b []*eventsv1.ActionEvent) error {
				_, err := loader.Record(ctx, b)
				return err
			}); err != nil {
				return nil, fmt.Errorf("loading: %w", err)
			}
			loaded += n
			fmt.Fprintf(progress, "scale: loaded %d events (day %d) in %s\n", loaded, day, time.Since(start).Round(time.Second))
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE action_events, actions"); err != nil {
			return nil, err
		}
		parts, err := loader.Partitions(ctx)
		if err != nil {
			return nil, err
		}
		point := ScalePoint{Stored: loaded, Partitions: len(parts), RecordPerSecond: map[int]float64{}}
		// Each query's median over the rounds of its p50 and p99: one round's p99 is a
		// few calls, which a pause of the machine's makes.
		var rounds [][]Latency
		for range o.Rounds {
			lats, err := measureQueries(ctx, o, svc, "s", loaded/len(phases), scaleActionsPerRun)
			if err != nil {
				return nil, err
			}
			rounds = append(rounds, lats)
		}
		point.Queries = medianLatencies(rounds)
		for _, batch := range o.BatchSizes {
			var rates []float64
			// A round not counted first: the service's connections and Postgres's caches
			// warm up on it.
			for round := -1; round < o.Rounds; round++ {
				evs := generate(fmt.Sprintf("w%d-%d-%d", size, batch, round+1), o.ScaleSize.RecordEvents, 100)
				d, err := fanOut(o.Clients, batches(evs, batch), func(c int, b []*eventsv1.ActionEvent) error {
					_, err := svc.clients[c].Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
					return err
				})
				if err != nil {
					return nil, fmt.Errorf("record: %w", err)
				}
				if round >= 0 {
					rates = append(rates, float64(len(evs))/d.Seconds())
				}
			}
			point.RecordPerSecond[batch] = benchutil.Median(rates)
		}
		fmt.Fprintf(progress, "scale: measured at %d events\n", loaded)
		res.Points = append(res.Points, point)
	}

	// Expire the first loaded day: the partitions before it (the service's present, with
	// the events Record wrote above) go first.
	parts, err := loader.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	events := map[string]int{}
	for _, p := range parts {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{p.Name}.Sanitize()).Scan(&n); err != nil {
			return nil, err
		}
		events[p.Name] = n
	}
	ttl := 24 * time.Hour
	now := firstDay.AddDate(0, 0, 1).Add(ttl).Add(time.Minute)
	dropped, err := loader.DropExpired(ctx, now, ttl, 5000)
	if err != nil {
		return nil, err
	}
	for _, d := range dropped.Dropped {
		res.Dropped = append(res.Dropped, DroppedDay{DroppedPartition: d, Events: events[d.Name]})
	}
	return res, nil
}

// medianLatencies is each query's median p50 and p99 over rounds.
func medianLatencies(rounds [][]Latency) []Latency {
	out := make([]Latency, len(rounds[0]))
	for i := range out {
		var p50, p99 []float64
		for _, r := range rounds {
			p50, p99 = append(p50, float64(r[i].P50)), append(p99, float64(r[i].P99))
		}
		out[i] = Latency{Query: rounds[0][i].Query, P50: time.Duration(benchutil.Median(p50)), P99: time.Duration(benchutil.Median(p99)), Calls: rounds[0][i].Calls * len(rounds)}
	}
	return out
}

// WriteScale writes the scale part's report.
func WriteScale(w io.Writer, o Options, r *ScaleResult) {
	if len(r.Points) == 0 {
		return
	}
	base := r.Points[0]
	fmt.Fprintf(w, "\n### The store from %d to %d events (%d events a day, a partition each), %d concurrent clients\n\n",
		base.Stored, r.Points[len(r.Points)-1].Stored, o.ScaleSize.EventsPerDay, o.Clients)
	fmt.Fprintf(w, "p99 of each query (p50 in brackets), medians of %d rounds of %d calls, and the ratio to the first size's p99:\n", o.Rounds, o.Queries)
	fmt.Fprintln(w)
	header := "| query |"
	rule := "| --- |"
	for _, p := range r.Points {
		header += fmt.Sprintf(" %d events (%d partitions) |", p.Stored, p.Partitions)
		rule += " ---: |"
	}
	fmt.Fprintln(w, header)
	fmt.Fprintln(w, rule)
	for i, q := range base.Queries {
		row := "| " + q.Query + " |"
		for _, p := range r.Points {
			l := p.Queries[i]
			row += fmt.Sprintf(" %s (%s) %.2f× |", l.P99.Round(10*time.Microsecond), l.P50.Round(10*time.Microsecond), float64(l.P99)/float64(q.P99))
		}
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Record, events/s (median of %d rounds of %d new events) and ratio to the first size's:\n\n", o.Rounds, o.ScaleSize.RecordEvents)
	fmt.Fprintln(w, strings.Replace(header, "| query |", "| batch |", 1))
	fmt.Fprintln(w, rule)
	for _, b := range o.BatchSizes {
		row := fmt.Sprintf("| %d |", b)
		for _, p := range r.Points {
			row += fmt.Sprintf(" %.0f %.2f× |", p.RecordPerSecond[b], p.RecordPerSecond[b]/base.RecordPerSecond[b])
		}
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Retention of the partitions past a TTL of 24 h (the last is the first loaded day):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| partition | events | actions deleted | re-filed | states deleted in | partition detached in | and dropped in |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, d := range r.Dropped {
		fmt.Fprintf(w, "| %s | %d | %d | %d | %s | %s | %s |\n", d.Name, d.Events, d.Actions, d.Refiled,
			d.States.Round(time.Millisecond), d.Detach.Round(time.Millisecond), d.Drop.Round(time.Millisecond))
	}
}

// Notify compares Record with its announcements made after commit (the notifier) and
// inside its transaction, store against store in this process, with small batches from
// many clients, where commits are most frequent.
func Notify(ctx context.Context, o Options, pool *pgxpool.Pool, progress io.Writer) (*NotifyResult, error) {
	after := store.New(pool)
	inside := store.New(pool, store.Options{NotifyInTransaction: true})
	res := &NotifyResult{Clients: o.NotifyClients, Batch: o.NotifyBatch}
	for round := range o.Rounds {
		for _, way := range []struct {
			st    *store.Store
			rates *[]float64
		}{{inside, &res.Inside}, {after, &res.After}} {
			if err := truncate(ctx, pool); err != nil {
				return nil, err
			}
			evs := generate(fmt.Sprintf("n%d", round), o.NotifyEvents, 100)
			d, err := fanOut(o.NotifyClients, batches(evs, o.NotifyBatch), func(_ int, b []*eventsv1.ActionEvent) error {
				_, err := way.st.Record(ctx, b)
				return err
			})
			if err != nil {
				return nil, err
			}
			*way.rates = append(*way.rates, float64(len(evs))/d.Seconds())
		}
		fmt.Fprintf(progress, "notify: round %d: inside %.0f/s, after %.0f/s\n", round, res.Inside[round], res.After[round])
	}
	return res, nil
}

// NotifyResult is Record's throughput, events/s per round, each way.
type NotifyResult struct {
	Clients, Batch int
	Inside, After  []float64
}

// WriteNotify writes the notify comparison.
func WriteNotify(w io.Writer, o Options, r *NotifyResult) {
	fmt.Fprintf(w, "\n### Announcing changes: inside Record's transaction or after it (%d clients, batches of %d, %d events a round)\n\n", r.Clients, r.Batch, o.NotifyEvents)
	fmt.Fprintln(w, "| way | events/s (median) | each round |")
	fmt.Fprintln(w, "| --- | ---: | --- |")
	each := func(xs []float64) string {
		var s []string
		for _, x := range xs {
			s = append(s, fmt.Sprintf("%.0f", x))
		}
		return strings.Join(s, " ")
	}
	fmt.Fprintf(w, "| NOTIFY inside the transaction | %.0f | %s |\n", benchutil.Median(r.Inside), each(r.Inside))
	fmt.Fprintf(w, "| announced after commit | %.0f | %s |\n", benchutil.Median(r.After), each(r.After))
	fmt.Fprintf(w, "\nAfter / inside: %.2f×\n", benchutil.Median(r.After)/benchutil.Median(r.Inside))
}
