package events_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/store"
	"github.com/flytekube/backend/events/watch"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
)

// openWatch starts a watch and waits until the server has established it.
func openWatch(t *testing.T, inst *instance, req *eventsv1.WatchActionsRequest) (*connect.ServerStreamForClient[eventsv1.WatchActionsResponse], context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := inst.client.WatchActions(ctx, connect.NewRequest(req))
	if err != nil {
		cancel()
		t.Fatalf("WatchActions: %v", err)
	}
	// The server sends headers once it is subscribed; ResponseHeader waits for them.
	_ = stream.ResponseHeader()
	t.Cleanup(func() { cancel(); _ = stream.Close() })
	return stream, cancel
}

func TestWatchAcrossReplicas(t *testing.T) {
	db := pg.NewDatabase(t)
	a := startInstance(t, db)
	b := startInstance(t, db)
	stream, _ := openWatch(t, b, &eventsv1.WatchActionsRequest{Project: "demo", Domain: "development", Run: "watched"})

	// Recorded through replica a: one matching action goes through its life, one
	// action of another run must not show up.
	id := actionID("watched", "a0")
	record(t, a.client, event(actionID("other", "a0"), 1, running, 0, 1), event(id, 1, queued, 0, 1))
	record(t, a.client, event(id, 1, running, 0, 2))
	record(t, a.client, event(id, 1, succeeded, 0, 3))

	deadline := time.After(30 * time.Second)
	received := make(chan *eventsv1.Action)
	go func() {
		for stream.Receive() {
			received <- stream.Msg().GetAction()
		}
		close(received)
	}()
	for {
		select {
		case act, ok := <-received:
			if !ok {
				t.Fatalf("stream ended: %v", stream.Err())
			}
			if act.GetId().GetRun() != "watched" {
				t.Fatalf("watch on run watched delivered %v", act.GetId())
			}
			if act.GetPhase() == succeeded {
				return // the final state arrived (intermediate ones may be coalesced)
			}
		case <-deadline:
			t.Fatal("replica b's watcher never saw the action succeed")
		}
	}
}

// A batch announces its actions several to a notification; every one must reach the
// watcher, across the notifications' boundaries.
func TestWatchSeesEveryActionOfALargeBatch(t *testing.T) {
	db := pg.NewDatabase(t)
	a := startInstance(t, db)
	b := startInstance(t, db)
	stream, _ := openWatch(t, b, &eventsv1.WatchActionsRequest{Project: "demo", Domain: "development", Run: "big"})

	const actions = 100 // more than three notifications' worth
	var batch []*eventsv1.ActionEvent
	for i := range actions {
		batch = append(batch, event(actionID("big", fmt.Sprintf("a%d", i)), 1, running, 0, 1))
	}
	record(t, a.client, batch...)

	seen := map[string]bool{}
	received := make(chan *eventsv1.Action)
	go func() {
		for stream.Receive() {
			received <- stream.Msg().GetAction()
		}
		close(received)
	}()
	deadline := time.After(30 * time.Second)
	for len(seen) < actions {
		select {
		case act, ok := <-received:
			if !ok {
				t.Fatalf("stream ended after %d actions: %v", len(seen), stream.Err())
			}
			seen[act.GetId().GetAction()] = true
		case <-deadline:
			t.Fatalf("the watcher saw %d of %d actions", len(seen), actions)
		}
	}
}

func TestSlowWatcherIsEndedWithoutBlockingRecord(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t), func(c *events.Config) { c.WatchBuffer = 4 })
	stream, _ := openWatch(t, inst, &eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"})

	// The watcher reads nothing while far more than its buffer and the HTTP/2 windows
	// (a few MiB) is recorded: 400 actions with 60 KiB messages.
	big := strings.Repeat("x", 60<<10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for b := range 40 {
		var batch []*eventsv1.ActionEvent
		for i := range 10 {
			e := event(actionID("flood", fmt.Sprintf("a%d-%d", b, i)), 1, running, 0, b)
			e.Message = big
			batch = append(batch, e)
		}
		if _, err := inst.client.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: batch})); err != nil {
			t.Fatalf("Record blocked or failed behind a slow watcher: %v", err)
		}
	}
	// Now the watcher reads: it gets what was buffered, then ResourceExhausted.
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodeResourceExhausted {
		t.Fatalf("slow watcher ended with %v; want ResourceExhausted", stream.Err())
	}
}

func TestWatchEndsUnavailableOnShutdown(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	stream, _ := openWatch(t, inst, &eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"})
	go inst.Stop()
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodeUnavailable {
		t.Fatalf("stream ended with %v; want Unavailable", stream.Err())
	}
}

// A hub that lost its feed waits before it listens again, longer after each failure in
// a row; once it listened again, the next loss starts over from the shortest wait
// rather than from where the last outage left off.
func TestHubReconnectWaitStartsOverOnceTheFeedWorked(t *testing.T) {
	st, pool := openStore(t, pg.NewDatabase(t))
	waits := &reconnectWaits{}
	hub := watch.NewHub(pool, st, watch.Config{}, slog.New(waits), watch.Metrics{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = hub.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	subscribe := func() *watch.Subscription {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s, err := hub.Subscribe(ctx, watch.Filter{Project: "demo", Domain: "development"}, "test") // once listening
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const losses = 4
	for range losses {
		s := subscribe()
		var killed int
		if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&killed); err != nil || killed != 1 {
			t.Fatalf("terminating the hub's LISTEN connection: %d terminated, %v", killed, err)
		}
		<-s.Done()
	}
	subscribe() // the last loss was logged before the hub listened again

	got := waits.get()
	if len(got) != losses {
		t.Fatalf("%d reconnect waits logged; want %d", len(got), losses)
	}
	for i, w := range got {
		if w > 100*time.Millisecond {
			t.Fatalf("waits before reconnecting: %v; the wait after loss %d grew though the feed had worked in between", got, i+1)
		}
	}
}

// reconnectWaits records the waits a hub logs before it listens again.
type reconnectWaits struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (h *reconnectWaits) Enabled(context.Context, slog.Level) bool { return true }
func (h *reconnectWaits) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *reconnectWaits) WithGroup(string) slog.Handler            { return h }

func (h *reconnectWaits) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "in" {
			h.mu.Lock()
			h.waits = append(h.waits, a.Value.Duration())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func (h *reconnectWaits) get() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.waits)
}

// Every notification nudges each Nudges channel, whatever action it names and whether
// or not anyone watches it; nudges coalesce rather than block the hub.
func TestHubNudgesOnEveryNotification(t *testing.T) {
	st, pool := openStore(t, pg.NewDatabase(t))
	hub := watch.NewHub(pool, st, watch.Config{}, slog.New(slog.DiscardHandler), watch.Metrics{})
	nudges := hub.Nudges()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = hub.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Subscribing waits until the hub listens; the subscription is for another project.
	subCtx, subCancel := context.WithTimeout(ctx, 30*time.Second)
	defer subCancel()
	if _, err := hub.Subscribe(subCtx, watch.Filter{Project: "other", Domain: "development"}, "test"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := st.Record(ctx, []*eventsv1.ActionEvent{event(actionID("nudged", fmt.Sprintf("a%d", i)), 1, queued, 0, i)}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-nudges:
		case <-time.After(10 * time.Second):
			t.Fatalf("record %d: no nudge", i)
		}
	}
	// Nobody reads: the hub keeps going, and one nudge waits.
	for i := range 5 {
		if _, err := st.Record(ctx, []*eventsv1.ActionEvent{event(actionID("unread", fmt.Sprintf("a%d", i)), 1, queued, 0, i)}); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, 10*time.Second, func() bool { return len(nudges) == 1 }, func() string { return "no nudge waiting after unread notifications" })
}

// A replica that could not announce some changes says so with store.ResyncPayload, and
// every watcher, on every replica, is ended to re-list rather than left with a stale view.
func TestResyncNotificationEndsWatchers(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	stream, _ := openWatch(t, inst, &eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"})
	pgtest.Exec(t, db, fmt.Sprintf("SELECT pg_notify('%s', '%s')", store.NotifyChannel, store.ResyncPayload))
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodeUnavailable || !strings.Contains(stream.Err().Error(), "resume from ListActions") {
		t.Fatalf("stream ended with %v; want Unavailable, to resume from ListActions", stream.Err())
	}
}
