package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

// env is one test's migrated database.
type env struct {
	url   string
	pool  *pgxpool.Pool
	store *store.Store
	box   *outbox.Outbox
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	url := pg.NewDatabase(t)
	pool := openPool(t, url)
	if _, err := postgres.Migrate(ctx, pool, store.Migrations(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return &env{url: url, pool: pool, store: store.New(pool), box: outbox.New(pool)}
}

// openPool opens a pool on the database at url, closed when the test ends.
func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (e *env) record(t *testing.T, evs ...*eventsv1.ActionEvent) store.RecordResult {
	t.Helper()
	res, err := e.store.Record(context.Background(), evs)
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	return res
}

// forgetAfter is how long the tests' leader keeps the cursor of a sink it does not know.
const forgetAfter = time.Hour

func (e *env) register(t *testing.T, names ...string) outbox.SinkChanges {
	t.Helper()
	changes, err := e.box.RegisterSinks(context.Background(), names, forgetAfter)
	if err != nil {
		t.Fatalf("RegisterSinks(%q): %v", names, err)
	}
	return changes
}

// unconfigured makes it look as if no replica had been configured with the sinks for
// longer than forgetAfter.
func (e *env) unconfigured(t *testing.T, names ...string) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), "UPDATE cloudevent_sinks SET configured_at = now() - $2::interval WHERE name = ANY ($1)",
		names, 2*forgetAfter); err != nil {
		t.Fatal(err)
	}
}

func (e *env) read(t *testing.T, sink string, limit int) []outbox.Entry {
	t.Helper()
	entries, err := e.box.Read(context.Background(), sink, limit)
	if err != nil {
		t.Fatalf("Read(%q): %v", sink, err)
	}
	return entries
}

func (e *env) advance(t *testing.T, sink string, to outbox.Position) {
	t.Helper()
	if err := e.box.Advance(context.Background(), sink, to); err != nil {
		t.Fatalf("Advance(%q, %s): %v", sink, to, err)
	}
}

// drain reads sink's entries until none is left, advancing after each batch, and returns
// them.
func (e *env) drain(t *testing.T, sink string) []outbox.Entry {
	t.Helper()
	var all []outbox.Entry
	for {
		entries := e.read(t, sink, 7)
		if len(entries) == 0 {
			return all
		}
		all = append(all, entries...)
		e.advance(t, sink, entries[len(entries)-1].Position)
	}
}

// queued counts the events in the outbox.
func (e *env) queued(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT coalesce(sum(count), 0) FROM event_outbox").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	queued       = flytecorev1.ActionPhase_ACTION_PHASE_QUEUED
	initializing = flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING
	running      = flytecorev1.ActionPhase_ACTION_PHASE_RUNNING
	succeeded    = flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED
)

// lifecycle is an action's events in the order the executor sends them.
var lifecycle = []struct {
	phase   flytecorev1.ActionPhase
	version uint32
}{{queued, 0}, {initializing, 0}, {running, 0}, {running, 1}, {succeeded, 0}}

// event is the i-th event of the lifecycle of run/action.
func event(run, action string, i int) *eventsv1.ActionEvent {
	return &eventsv1.ActionEvent{
		Id:         &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: run, Action: action},
		Attempt:    1,
		Phase:      lifecycle[i].phase,
		Version:    lifecycle[i].version,
		OccurredAt: timestamppb.New(epoch.Add(time.Duration(i) * time.Second)),
		Reason:     fmt.Sprintf("step %d", i),
	}
}

// name identifies an entry's event in failure messages and comparisons.
func name(e outbox.Entry) string {
	return fmt.Sprintf("%s/%d/%s/%d", e.Key, e.Attempt, e.Phase, e.Version)
}

func names(entries []outbox.Entry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = name(e)
	}
	return out
}

func eventName(ev *eventsv1.ActionEvent) string {
	return fmt.Sprintf("%s/%d/%s/%d", store.KeyOf(ev.GetId()), ev.GetAttempt(), ev.GetPhase(), ev.GetVersion())
}
