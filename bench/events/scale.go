package eventsbench

import (
	"context"
	"fmt"
	"io"
	neturl "net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/events/store"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// The scale part grows one store through the sizes of ScaleSize.Stored and, at each,
// measures the queries and Record's throughput against a second store, in a database of
// its own on the same Postgres, held at the first size: rounds alternate between the two,
// and each figure is the median of the rounds' ratios, so that the machine's drift
// (which moves a figure by a third between minutes here) falls out. Then it drops the
// expired partitions, the oldest loaded day's among them.
//
// The stores are filled a day at a time (EventsPerDay, a million actions a day by
// default) through the store itself, with a clock that files each day's actions on a day
// of its own, so that the store has the partitions a deployment would; Record and the
// queries are measured through the service, as clients call it. Record's measurement
// events go to the present's partition of each store; the baseline's are deleted after
// each size, so that it stays at the first size.

// ScaleSize sizes the scale part.
type ScaleSize struct {
	// Stored are the store sizes to measure at, in events, smallest first; the first is
	// the baseline's.
	Stored []int
	// EventsPerDay is how many events one day's partition holds.
	EventsPerDay int
	// RecordEvents is how many new events each Record measurement writes.
	RecordEvents int
}

// ScalePoint is the figures at one store size, each beside the baseline's of the same
// rounds.
type ScalePoint struct {
	Stored, Partitions int
	// Queries and Base are each query's latency (medians over the rounds) in the grown
	// store and in the baseline; QueryRatios the medians of the rounds' p99 ratios.
	Queries, Base []Latency
	QueryRatios   []float64
	// Record and RecordBase are events/s per batch size (medians), RecordRatios the
	// medians of the rounds' ratios.
	Record, RecordBase, RecordRatios map[int]float64
}

// ScaleResult is the scale part's figures.
type ScaleResult struct {
	BaseStored int
	Points     []ScalePoint
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

// scaleStore is one of the part's two stores: its service and its loader.
type scaleStore struct {
	pool     *pgxpool.Pool
	svc      *service
	loader   *store.Store
	clk      *clocktesting.FakeClock
	firstDay time.Time
	loaded   int
}

// load grows the store to size events, a day's partition at a time.
func (st *scaleStore) load(ctx context.Context, o Options, size int, progress io.Writer) error {
	for st.loaded < size {
		day := st.loaded / o.ScaleSize.EventsPerDay
		n := min(size, (day+1)*o.ScaleSize.EventsPerDay) - st.loaded
		when := st.firstDay.AddDate(0, 0, day).Add(time.Hour)
		st.clk.SetTime(when)
		if _, err := st.loader.MaintainPartitions(ctx, when); err != nil {
			return err
		}
		start := time.Now()
		evs := generateFrom("s", st.loaded/len(phases), n, scaleActionsPerRun)
		if _, err := fanOut(o.Clients, batches(evs, 1000), func(_ int, b []*eventsv1.ActionEvent) error {
			_, err := st.loader.Record(ctx, b)
			return err
		}); err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		st.loaded += n
		fmt.Fprintf(progress, "scale: loaded %d events (day %d) in %s\n", st.loaded, day, time.Since(start).Round(time.Second))
	}
	_, err := st.pool.Exec(ctx, "VACUUM ANALYZE action_events, actions")
	return err
}

// record writes RecordEvents new events through the service in batches of batch and
// returns the rate.
func (st *scaleStore) record(ctx context.Context, o Options, prefix string, batch int) (float64, error) {
	evs := generate(prefix, o.ScaleSize.RecordEvents, 100)
	d, err := fanOut(o.Clients, batches(evs, batch), func(c int, b []*eventsv1.ActionEvent) error {
		_, err := st.svc.clients[c].Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("record: %w", err)
	}
	return float64(len(evs)) / d.Seconds(), nil
}

func openScaleStore(ctx context.Context, o Options, url string, pool *pgxpool.Pool) (*scaleStore, error) {
	if err := truncate(ctx, pool); err != nil {
		return nil, err
	}
	so := o
	so.DatabaseURL = url
	svc, err := startService(ctx, so)
	if err != nil {
		return nil, err
	}
	// The days of the load come after the service's present, which the first partitions
	// already cover.
	firstDay := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, store.DefaultPartitionsAhead+2)
	clk := clocktesting.NewFakeClock(firstDay)
	return &scaleStore{pool: pool, svc: svc, loader: store.New(pool, store.Options{Clock: clk}), clk: clk, firstDay: firstDay}, nil
}

// baselineDatabase makes (anew) a database beside the one at url and returns its URL.
func baselineDatabase(ctx context.Context, url string) (string, error) {
	return freshDatabase(ctx, url, "events_bench_baseline")
}

// freshDatabase makes (anew) the database name beside the one at url and returns its URL.
func freshDatabase(ctx context.Context, url, name string) (string, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "", err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	u, err := neturl.Parse(url)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// Scale runs the scale part on a fresh store and a baseline beside it.
func Scale(ctx context.Context, o Options, pool *pgxpool.Pool, progress io.Writer) (*ScaleResult, error) {
	baseURL, err := baselineDatabase(ctx, o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("baseline database: %w", err)
	}
	basePool, err := benchutil.OpenMigrated(ctx, baseURL, store.Migrations())
	if err != nil {
		return nil, err
	}
	defer basePool.Close()
	base, err := openScaleStore(ctx, o, baseURL, basePool)
	if err != nil {
		return nil, err
	}
	defer func() { _ = base.svc.stop() }()
	grown, err := openScaleStore(ctx, o, o.DatabaseURL, pool)
	if err != nil {
		return nil, err
	}
	defer func() { _ = grown.svc.stop() }()
	if err := base.load(ctx, o, o.ScaleSize.Stored[0], progress); err != nil {
		return nil, err
	}

	res := &ScaleResult{BaseStored: base.loaded}
	for _, size := range o.ScaleSize.Stored {
		if err := grown.load(ctx, o, size, progress); err != nil {
			return nil, err
		}
		parts, err := grown.loader.Partitions(ctx)
		if err != nil {
			return nil, err
		}
		point := ScalePoint{Stored: grown.loaded, Partitions: len(parts),
			Record: map[int]float64{}, RecordBase: map[int]float64{}, RecordRatios: map[int]float64{}}
		// Rounds alternate between the stores; a round's p99 is a few calls, which a
		// pause of the machine's makes, so each figure is a median of rounds.
		var grownRounds, baseRounds [][]Latency
		var ratios [][]float64
		for range o.Rounds {
			b, err := measureQueries(ctx, o, base.svc, "s", base.loaded/len(phases), scaleActionsPerRun)
			if err != nil {
				return nil, err
			}
			g, err := measureQueries(ctx, o, grown.svc, "s", grown.loaded/len(phases), scaleActionsPerRun)
			if err != nil {
				return nil, err
			}
			baseRounds, grownRounds = append(baseRounds, b), append(grownRounds, g)
			for i := range g {
				if len(ratios) <= i {
					ratios = append(ratios, nil)
				}
				ratios[i] = append(ratios[i], float64(g[i].P99)/float64(b[i].P99))
			}
		}
		point.Queries, point.Base = medianLatencies(grownRounds), medianLatencies(baseRounds)
		for _, r := range ratios {
			point.QueryRatios = append(point.QueryRatios, benchutil.Median(r))
		}
		for _, batch := range o.BatchSizes {
			var g, b, r []float64
			// A round not counted first: connections and caches warm up on it.
			for round := -1; round < o.Rounds; round++ {
				prefix := fmt.Sprintf("w%d-%d-%d", size, batch, round+1)
				rb, err := base.record(ctx, o, prefix, batch)
				if err != nil {
					return nil, err
				}
				rg, err := grown.record(ctx, o, prefix, batch)
				if err != nil {
					return nil, err
				}
				if round >= 0 {
					g, b, r = append(g, rg), append(b, rb), append(r, rg/rb)
				}
			}
			point.Record[batch], point.RecordBase[batch], point.RecordRatios[batch] = benchutil.Median(g), benchutil.Median(b), benchutil.Median(r)
		}
		// The baseline stays at its size.
		for _, sql := range []string{"DELETE FROM action_events WHERE run LIKE 'w%'", "DELETE FROM actions WHERE run LIKE 'w%'", "VACUUM ANALYZE action_events, actions"} {
			if _, err := base.pool.Exec(ctx, sql); err != nil {
				return nil, err
			}
		}
		fmt.Fprintf(progress, "scale: measured at %d events\n", grown.loaded)
		res.Points = append(res.Points, point)
	}

	// Expire the first loaded day: the partitions before it (the service's present, with
	// the events Record wrote above) go first.
	parts, err := grown.loader.Partitions(ctx)
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
	now := grown.firstDay.AddDate(0, 0, 1).Add(ttl).Add(time.Minute)
	dropped, err := grown.loader.DropExpired(ctx, now, ttl, 5000)
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
	fmt.Fprintf(w, "\n### The store from %d to %d events (%d events a day, a partition each), against a baseline of %d, %d concurrent clients\n\n",
		r.Points[0].Stored, r.Points[len(r.Points)-1].Stored, o.ScaleSize.EventsPerDay, r.BaseStored, o.Clients)
	fmt.Fprintf(w, "p99 of each query (p50 in brackets; medians of %d rounds of %d calls) in the grown store, and the median of the rounds' ratios to the baseline's p99, measured in turn:\n\n", o.Rounds, o.Queries)
	header := "| query | baseline, " + fmt.Sprint(r.BaseStored) + " events |"
	rule := "| --- | ---: |"
	for _, p := range r.Points {
		header += fmt.Sprintf(" %d events (%d partitions) |", p.Stored, p.Partitions)
		rule += " ---: |"
	}
	fmt.Fprintln(w, header)
	fmt.Fprintln(w, rule)
	for i, q := range r.Points[0].Base {
		row := fmt.Sprintf("| %s | %s (%s) |", q.Query, q.P99.Round(10*time.Microsecond), q.P50.Round(10*time.Microsecond))
		for _, p := range r.Points {
			l := p.Queries[i]
			row += fmt.Sprintf(" %s (%s) **%.2f×** |", l.P99.Round(10*time.Microsecond), l.P50.Round(10*time.Microsecond), p.QueryRatios[i])
		}
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Record, events/s (medians of %d rounds of %d new events, after one not counted) in the grown store, and the median of the rounds' ratios to the baseline's:\n\n", o.Rounds, o.ScaleSize.RecordEvents)
	fmt.Fprintln(w, strings.Replace(header, "| query |", "| batch |", 1))
	fmt.Fprintln(w, rule)
	for _, b := range o.BatchSizes {
		row := fmt.Sprintf("| %d | %.0f |", b, r.Points[0].RecordBase[b])
		for _, p := range r.Points {
			row += fmt.Sprintf(" %.0f **%.2f×** |", p.Record[b], p.RecordRatios[b])
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
	after := store.New(pool, store.Options{NotifyAfterCommit: true})
	inside := store.New(pool)
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
