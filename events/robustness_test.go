package events_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flytekube/backend/events/store"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

func storeKey(e *eventsv1.ActionEvent) store.Key { return store.KeyOf(e.GetId()) }

// countRows counts the events and the actions stored.
func countRows(t *testing.T, dbURL string) (events, actions int) {
	t.Helper()
	pgtest.QueryRow(t, dbURL, "SELECT (SELECT count(*) FROM action_events), (SELECT count(*) FROM actions)", &events, &actions)
	return events, actions
}

func TestInvalidRequestsAreRejectedAndWriteNothing(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	batchWith := func(i int, mutate func(*eventsv1.ActionEvent)) *eventsv1.RecordRequest {
		var evs []*eventsv1.ActionEvent
		for j := range 5 {
			e := event(actionID("r1", fmt.Sprintf("a%d", j)), 1, running, 0, j)
			if j == i {
				mutate(e)
			}
			evs = append(evs, e)
		}
		return &eventsv1.RecordRequest{Events: evs}
	}
	tooMany := &eventsv1.RecordRequest{}
	for i := range 1001 {
		tooMany.Events = append(tooMany.Events, event(actionID("r1", fmt.Sprintf("a%d", i)), 1, running, 0, i))
	}
	c := inst.client
	ctx := context.Background()
	tests := []struct {
		name      string
		call      func() error
		wantField string
	}{
		{"empty batch", func() error { _, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{})); return err }, "events"},
		{"more than 1000 events", func() error { _, err := c.Record(ctx, connect.NewRequest(tooMany)); return err }, "events"},
		{"one bad event spoils the batch", func() error {
			_, err := c.Record(ctx, connect.NewRequest(batchWith(3, func(e *eventsv1.ActionEvent) { e.Attempt = 0 })))
			return err
		}, "events[3].attempt"},
		{"missing identifier", func() error {
			_, err := c.Record(ctx, connect.NewRequest(batchWith(2, func(e *eventsv1.ActionEvent) { e.Id = nil })))
			return err
		}, "events[2].id"},
		{"uppercase project", func() error {
			_, err := c.Record(ctx, connect.NewRequest(batchWith(0, func(e *eventsv1.ActionEvent) { e.Id.Project = "Demo" })))
			return err
		}, "events[0].id.project"},
		{"unspecified phase", func() error {
			_, err := c.Record(ctx, connect.NewRequest(batchWith(4, func(e *eventsv1.ActionEvent) { e.Phase = 0 })))
			return err
		}, "events[4].phase"},
		{"missing occurred_at", func() error {
			_, err := c.Record(ctx, connect.NewRequest(batchWith(1, func(e *eventsv1.ActionEvent) { e.OccurredAt = nil })))
			return err
		}, "events[1].occurred_at"},
		{"log link that is not a URI", func() error {
			_, err := c.Record(ctx, connect.NewRequest(batchWith(1, func(e *eventsv1.ActionEvent) {
				e.LogLinks = []*eventsv1.LogLink{{Name: "logs", Uri: "not a uri"}}
			})))
			return err
		}, "events[1].log_links[0].uri"},
		{"GetAction without id", func() error { _, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{})); return err }, "id"},
		{"ListActions without project", func() error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Domain: "development"}))
			return err
		}, "project"},
		{"ListActions page too large", func() error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", PageSize: 1001}))
			return err
		}, "page_size"},
		{"ListActions phase past what the store holds", func() error { // a newer release's phase is a filter like any
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", Phase: 70000}))
			return err
		}, "phase"},
		{"ListActionEvents with a bad action name", func() error {
			id := actionID("r1", "a_0")
			_, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id}))
			return err
		}, "id.action"},
		{"WatchActions with a bad run", func() error {
			stream, err := c.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: "demo", Domain: "development", Run: "UPPER"}))
			if err != nil {
				return err
			}
			for stream.Receive() {
			}
			return stream.Err()
		}, "run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { servicetest.RequireInvalidArgument(t, tt.call(), tt.wantField) })
	}
	requireNothingStored(t, db)
}

// TestRestartLosesNoAcknowledgedEvent restarts the service under a writer: every batch
// the service acknowledged must be stored, whatever happened to the others.
func TestRestartLosesNoAcknowledgedEvent(t *testing.T) {
	db := pg.NewDatabase(t)
	first := startInstance(t, db)

	var (
		mu     sync.Mutex
		acked  []*eventsv1.ActionEvent
		client atomic.Pointer[eventsv1connect.EventsServiceClient]
		stop   atomic.Bool
		wg     sync.WaitGroup
	)
	client.Store(&first.client)
	const writers = 4
	var batches atomic.Int64
	for w := range writers {
		wg.Go(func() {
			for b := 0; !stop.Load(); b++ {
				var batch []*eventsv1.ActionEvent
				for i := range 50 {
					batch = append(batch, event(actionID(fmt.Sprintf("w%d", w), fmt.Sprintf("b%d-%d", b, i)), 1, running, 0, b))
				}
				if _, err := (*client.Load()).Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: batch})); err != nil {
					time.Sleep(10 * time.Millisecond) // not acknowledged: the client may retry or drop it
					continue
				}
				batches.Add(1)
				mu.Lock()
				acked = append(acked, batch...)
				mu.Unlock()
			}
		})
	}
	waitFor := func(n int64) {
		for batches.Load() < n {
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(20)
	first.Stop() // graceful: in-flight batches finish, new ones are refused
	second := startInstance(t, db)
	client.Store(&second.client)
	waitFor(batches.Load() + 20)
	stop.Store(true)
	wg.Wait()

	st, _ := openStore(t, db)
	var missing int
	for _, e := range acked {
		if _, err := st.GetAction(context.Background(), storeKey(e), nil); err != nil {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged events are missing after a restart", missing, len(acked))
	}
	t.Logf("%d acknowledged events across a restart, none lost", len(acked))
}

func TestMetricsEndpoint(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	e := event(actionID("r1", "a0"), 1, running, 0, 1)
	record(t, inst.client, e)
	record(t, inst.client, e)
	inst.RequireMetrics(t,
		"flyte_events_received_total 2",
		"flyte_events_recorded_total 1",
		"flyte_events_duplicates_total 1",
		"flyte_events_record_batch_size_count 2",
		`flyte_events_record_duration_seconds_count{outcome="ok"} 2`,
		"flyte_events_watchers 0",
	)
	// otelconnect's, through the OpenTelemetry bridge
	if n, err := testutil.GatherAndCount(inst.Gatherer(), "rpc_server_call_duration_seconds"); err != nil || n == 0 {
		t.Errorf("/metrics has %d series of rpc_server_call_duration_seconds (%v); want the RPCs'", n, err)
	}
}
