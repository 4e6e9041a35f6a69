package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/events/relay"
	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/internal/backoff"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

// db is a migrated events database of its own.
type db struct {
	pool   *pgxpool.Pool
	store  *store.Store
	outbox *outbox.Outbox
}

func newDB(t *testing.T) *db {
	t.Helper()
	ctx := context.Background()
	pool, err := postgres.Open(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := postgres.Migrate(ctx, pool, store.Migrations(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return &db{pool: pool, store: store.New(pool), outbox: outbox.New(pool)}
}

// record stores events as Record does, failing the test on error.
func (d *db) record(t *testing.T, evs ...*eventsv1.ActionEvent) {
	t.Helper()
	if _, err := d.store.Record(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// phases an action goes through, one event each, in attempt 1.
var lifecycle = []flytecorev1.ActionPhase{
	flytecorev1.ActionPhase_ACTION_PHASE_QUEUED,
	flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING,
	flytecorev1.ActionPhase_ACTION_PHASE_RUNNING,
	flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED,
}

// actionEvents are the events of one action of run, in the order the executor reports
// them.
func actionEvents(run, action string) []*eventsv1.ActionEvent {
	out := make([]*eventsv1.ActionEvent, len(lifecycle))
	for i, ph := range lifecycle {
		out[i] = &eventsv1.ActionEvent{
			Id:      &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: run, Action: action},
			Attempt: 1, Phase: ph, Version: uint32(i),
			OccurredAt: timestamppb.New(epoch.Add(time.Duration(i) * time.Second)),
			TaskType:   "container",
		}
	}
	return out
}

// receiver is an HTTP CloudEvents receiver that keeps what it accepted, in order, and
// answers as answer says (200 when nil).
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	accepted []received
	answer   func(r received) int
	seen     int // requests, accepted or not
}

// received is one CloudEvent as a consumer reads it.
type received struct {
	id, run, action  string
	attempt, version int32
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var events []event.Event
		if cehttp.IsHTTPBatch(req.Header) {
			batch, err := cehttp.NewEventsFromHTTPRequest(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			events = batch
		} else {
			e, err := cehttp.NewEventFromHTTPRequest(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			events = []event.Event{*e}
		}
		// A batch is answered with its first refusal, and accepted only whole.
		status := http.StatusOK
		batch := make([]received, 0, len(events))
		for _, e := range events {
			ext := e.Extensions()
			r := received{id: e.ID(), run: fmt.Sprint(ext["flyterun"]), action: fmt.Sprint(ext["flyteaction"])}
			var body eventsv1.ActionEvent
			if err := jsonData(e.Data(), &body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.attempt, r.version = int32(body.GetAttempt()), int32(body.GetVersion())
			rc.mu.Lock()
			rc.seen++
			answer := rc.answer
			rc.mu.Unlock()
			if answer != nil && status/100 == 2 {
				status = answer(r)
			}
			batch = append(batch, r)
		}
		if status/100 == 2 {
			rc.mu.Lock()
			rc.accepted = append(rc.accepted, batch...)
			rc.mu.Unlock()
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) setAnswer(f func(received) int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.answer = f
}

func (rc *receiver) got() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.accepted)
}

// sink is the configuration of a sink named name publishing to the receiver in mode
// (binary when empty).
func (rc *receiver) sink(t *testing.T, name string, mode cloudevents.Mode) cloudevents.Config {
	t.Helper()
	c, err := cloudevents.SinkSpec{Name: name, HTTP: &cloudevents.HTTPSpec{URL: rc.URL + "/events", Mode: mode}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// relayed is a relay running in the background, as one replica's.
type relayed struct {
	registry *prometheus.Registry
	stop     func()
}

// startRelay runs a relay of d's outbox to sinks until the test ends or stop is called.
func startRelay(t *testing.T, d *db, sinks ...cloudevents.Config) *relayed {
	t.Helper()
	names := make([]string, len(sinks))
	for i, s := range sinks {
		names[i] = s.Name()
	}
	reg := prometheus.NewRegistry()
	m, err := relay.NewMetrics(reg, names)
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(d.outbox, relay.Config{
		Sinks: sinks, Cluster: "test", Batch: 100, Poll: 20 * time.Millisecond,
		Backoff:     backoff.Backoff{Base: 10 * time.Millisecond, Cap: 200 * time.Millisecond},
		LeaderCheck: 100 * time.Millisecond, Trim: 50 * time.Millisecond, Lag: 50 * time.Millisecond,
	}, nil, m, testLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &relayed{registry: reg, stop: stop}
}

// leading reads the relay's leader gauge.
func (r *relayed) leading(t *testing.T) bool {
	t.Helper()
	mfs, err := r.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "flyte_events_cloudevents_leader" {
			return mf.GetMetric()[0].GetGauge().GetValue() == 1
		}
	}
	return false
}

func (r *relayed) counter(t *testing.T, name, sink string) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(r.registry, name)
	if err != nil || n == 0 {
		t.Fatalf("%s: %v", name, err)
	}
	mfs, _ := r.registry.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "sink" && l.GetValue() == sink {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// registered waits until the relay has registered the sinks, so that what is recorded
// from then on is queued for them.
func registered(t *testing.T, d *db, names ...string) {
	t.Helper()
	eventually.True(t, 20*time.Second, func() bool {
		for _, n := range names {
			if _, _, err := d.outbox.Lag(context.Background(), n); err != nil {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("sinks %v never registered", names) })
}

// inOrderOnce checks that every event of want was accepted exactly once and, per
// action, in the order recorded.
func inOrderOnce(t *testing.T, got []received, want int) {
	t.Helper()
	seen := map[string]int{}
	last := map[string]int32{}
	for _, r := range got {
		seen[r.id]++
		key := r.run + "/" + r.action
		if v, ok := last[key]; ok && r.version <= v {
			t.Errorf("%s: version %d after %d: out of order", key, r.version, v)
		}
		last[key] = r.version
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s accepted %d times", id, n)
		}
	}
	if len(seen) != want {
		t.Errorf("%d distinct events accepted, want %d", len(seen), want)
	}
}

// testLogger shows the relay's log with -v.
func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
