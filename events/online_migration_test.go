package events_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/eventsrelease"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
)

// previousRelease is the release whose events service must keep serving beside the
// tree's, on the tree's schema, through the migration and after it.
const previousRelease = "v0.1.0"

// The tree's migration runs while the previous release's events service records (with
// redeliveries) and serves reads, and then both versions serve side by side: no call of
// either fails, every event is stored once and queued to the outbox once, whichever
// version got it (and however often), and both versions read every action's latest
// state and whole history.
func TestMigrationWhileThePreviousReleaseServes(t *testing.T) {
	ctx := context.Background()
	binary, err := eventsrelease.Binary(ctx, previousRelease)
	if err != nil {
		t.Fatal(err)
	}
	db := pg.NewDatabase(t)
	// Nothing listens there: the relays retry, and the outbox keeps every row it queued.
	const sinkURL = "http://127.0.0.1:1/events?name=upgrade"
	old, _ := startPrevious(t, binary, db, "--cloudevents-sink", sinkURL)

	w := newMixedWorkload(120)
	clients := []eventsv1connect.EventsServiceClient{old.Client}
	var (
		mu       sync.Mutex
		failures []string
		sent     atomic.Int64
	)
	fail := func(version, call string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf("%s %s: %v", version, call, err))
	}
	newUp := make(chan eventsv1connect.EventsServiceClient)
	third := len(w.batches) / 3
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		var tree eventsv1connect.EventsServiceClient
		for k, b := range w.batches {
			if k == 2*third {
				tree = <-newUp
			}
			// Before the tree's service serves, everything goes to the old one; after,
			// batches alternate and each redelivery goes to the other version.
			to, other := old.Client, old.Client
			names := [2]string{previousRelease, previousRelease}
			if tree != nil {
				if k%2 == 1 {
					to, other, names = tree, old.Client, [2]string{"tree", previousRelease}
				} else {
					to, other, names = old.Client, tree, [2]string{previousRelease, "tree"}
				}
			}
			w.send(ctx, to, names[0], b, fail)
			if k > 0 {
				w.send(ctx, other, names[1], w.batches[k-1], fail)
			}
			if tree != nil {
				// An event stored before the migration, redelivered after it.
				w.send(ctx, other, names[1], w.batches[k-2*third], fail)
			}
			sent.Add(1)
		}
	}()
	readersDone := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() { w.read(ctx, old.Client, previousRelease, readersDone, fail) })
	watchers := []*finishedWatch{watchFinished(t, old.Client, previousRelease)}

	eventually.True(t, time.Minute, func() bool { return sent.Load() >= int64(third) },
		func() string { return fmt.Sprintf("the old service took %d of %d batches", sent.Load(), third) })
	// The migration, as the tree's first replica (or its migration Job) runs it.
	pool, err := postgres.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := postgres.Migrate(ctx, pool, store.Migrations(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("migrating while %s serves: %v", previousRelease, err)
	}
	eventually.True(t, time.Minute, func() bool { return sent.Load() >= int64(2*third) },
		func() string { return fmt.Sprintf("the old service took %d of %d batches", sent.Load(), 2*third) })
	sink, err := cloudevents.Parse(sinkURL)
	if err != nil {
		t.Fatal(err)
	}
	treeInst := startInstance(t, db, func(c *events.Config) { c.CloudEvents.Sinks = append(c.CloudEvents.Sinks, sink) })
	clients = append(clients, treeInst.client)
	readers.Go(func() { w.read(ctx, treeInst.client, "tree", readersDone, fail) })
	watchers = append(watchers, watchFinished(t, treeInst.client, "tree"))
	newUp <- treeInst.client
	<-writerDone
	close(readersDone)
	readers.Wait()

	for _, f := range failures[:min(len(failures), 10)] {
		t.Error(f)
	}
	if len(failures) > 0 {
		t.Fatalf("%d calls failed", len(failures))
	}

	// Every event stored once.
	rows, err := pool.Query(ctx, `SELECT project, domain, run, action, attempt, phase, version, count(*)
FROM action_events WHERE run <> $1 GROUP BY 1, 2, 3, 4, 5, 6, 7`, watchProbeRun)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]int{}
	for rows.Next() {
		var k store.Key
		var attempt, version int32
		var phase int16
		var n int
		if err := rows.Scan(&k.Project, &k.Domain, &k.Run, &k.Action, &attempt, &phase, &version, &n); err != nil {
			t.Fatal(err)
		}
		stored[fmt.Sprintf("%s %d %d %d", k, attempt, phase, version)] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	checkOnce(t, "stored", stored, w.identities())

	// Every stored event queued to the outbox once.
	queued := map[string]int{}
	rows, err = pool.Query(ctx, `SELECT e FROM event_outbox, unnest(events) AS e`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			t.Fatal(err)
		}
		var ev eventsv1.ActionEvent
		if err := proto.Unmarshal(b, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.GetId().GetRun() != watchProbeRun {
			queued[identityOf(&ev)]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	checkOnce(t, "queued to the outbox", queued, w.identities())

	// Watchers of both versions hear of every action's end, whichever version recorded it.
	for _, wf := range watchers {
		eventually.True(t, 30*time.Second, func() bool { return wf.finished() == len(w.ids) },
			func() string {
				return fmt.Sprintf("a watcher of %s heard %d of %d actions finish (stream: %v)", wf.version, wf.finished(), len(w.ids), wf.err())
			})
	}

	// Both versions read every action's latest state and whole history.
	for i, c := range clients {
		version := []string{previousRelease, "tree"}[i]
		for _, id := range w.ids {
			a, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
			if err != nil {
				t.Fatalf("%s GetAction(%s): %v", version, store.KeyOf(id), err)
			}
			if got := a.Msg.GetAction().GetPhase(); got != succeeded {
				t.Errorf("%s: %s is %s; want it succeeded", version, store.KeyOf(id), got)
			}
			evs, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: 100}))
			if err != nil {
				t.Fatalf("%s ListActionEvents(%s): %v", version, store.KeyOf(id), err)
			}
			if got := len(evs.Msg.GetEvents()); got != len(mixedPhases) {
				t.Errorf("%s: %s lists %d events; want %d", version, store.KeyOf(id), got, len(mixedPhases))
			}
		}
	}
}

// finishedWatch is a WatchActions stream of the workload's domain, noting the actions
// it hears succeed.
type finishedWatch struct {
	version string
	mu      sync.Mutex
	done    map[string]bool
	ended   error
}

func watchFinished(t *testing.T, c eventsv1connect.EventsServiceClient, version string) *finishedWatch {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	wf := &finishedWatch{version: version, done: map[string]bool{}}
	stream, err := c.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"}))
	if err != nil {
		t.Fatalf("%s WatchActions: %v", version, err)
	}
	probe := strings.ReplaceAll(version, ".", "-") // a DNS label
	subscribed := make(chan struct{})
	var once sync.Once
	go func() {
		for stream.Receive() {
			a := stream.Msg().GetAction()
			if a.GetId().GetRun() == watchProbeRun {
				if a.GetId().GetAction() == probe {
					once.Do(func() { close(subscribed) })
				}
				continue
			}
			if a.GetPhase() == succeeded {
				wf.mu.Lock()
				wf.done[store.KeyOf(a.GetId()).String()] = true
				wf.mu.Unlock()
			}
		}
		wf.mu.Lock()
		wf.ended = fmt.Errorf("ended: %v", stream.Err())
		wf.mu.Unlock()
	}()
	// Subscribed once it hears of a probe action recorded after it was opened.
	for v := uint32(0); ; v++ {
		if _, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{
			event(actionID(watchProbeRun, probe), 1, running, v, 0),
		}})); err != nil {
			t.Fatalf("%s Record (a probe of the watch): %v", version, err)
		}
		select {
		case <-subscribed:
			return wf
		case <-time.After(eventually.Interval):
		}
	}
}

// watchProbeRun is the run of the actions that tell a watcher has subscribed; the test
// counts no event of it.
const watchProbeRun = "watch-probe"

func (wf *finishedWatch) finished() int {
	wf.mu.Lock()
	defer wf.mu.Unlock()
	return len(wf.done)
}

func (wf *finishedWatch) err() error {
	wf.mu.Lock()
	defer wf.mu.Unlock()
	return wf.ended
}

// startPrevious runs the previous release's events service on db with args until the
// test ends, and shows its log when the test fails; it returns the log's path.
func startPrevious(t *testing.T, binary, db string, args ...string) (*eventsrelease.Service, string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "events-"+previousRelease+".log")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("the %s service's log:\n%s", previousRelease, tail(b, 4000))
		}
	})
	old, err := eventsrelease.Start(context.Background(), binary, db, logPath, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Stop)
	return old, logPath
}

// checkOnce fails the test unless got holds each of want once, and nothing else.
func checkOnce(t *testing.T, what string, got map[string]int, want map[string]bool) {
	t.Helper()
	var wrong []string
	for id, n := range got {
		if n != 1 || !want[id] {
			wrong = append(wrong, fmt.Sprintf("%s ×%d", id, n))
		}
	}
	for id := range want {
		if got[id] == 0 {
			wrong = append(wrong, id+" ×0")
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%s: %d events not once each (of %d), e.g. %v", what, len(wrong), len(want), wrong[:min(len(wrong), 5)])
	}
}

func identityOf(ev *eventsv1.ActionEvent) string {
	return fmt.Sprintf("%s %d %d %d", store.KeyOf(ev.GetId()), ev.GetAttempt(), ev.GetPhase(), ev.GetVersion())
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// mixedPhases are the phases each action of the workload goes through.
var mixedPhases = []flytecorev1.ActionPhase{queued, initialized, running, succeeded}

// mixedWorkload is a steady stream of batches, as the executor sends them: each batch
// moves ten actions one phase on, so every action is recorded over several batches.
type mixedWorkload struct {
	ids     []*flytecorev1.ActionIdentifier
	batches [][]*eventsv1.ActionEvent
}

func newMixedWorkload(actions int) *mixedWorkload {
	w := &mixedWorkload{}
	for i := range actions {
		w.ids = append(w.ids, actionID(fmt.Sprintf("r%d", i/10), fmt.Sprintf("a%d", i%10)))
	}
	for step, phase := range mixedPhases {
		for first := 0; first < actions; first += 10 {
			var b []*eventsv1.ActionEvent
			for _, id := range w.ids[first:min(first+10, actions)] {
				b = append(b, event(id, 1, phase, 0, step))
			}
			w.batches = append(w.batches, b)
		}
	}
	return w
}

func (w *mixedWorkload) identities() map[string]bool {
	ids := map[string]bool{}
	for _, b := range w.batches {
		for _, ev := range b {
			ids[identityOf(ev)] = true
		}
	}
	return ids
}

// send records batch b through c, reporting a failure; it does not retry, so that a
// call that fails is seen.
func (w *mixedWorkload) send(ctx context.Context, c eventsv1connect.EventsServiceClient, version string, b []*eventsv1.ActionEvent, fail func(string, string, error)) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b})); err != nil {
		fail(version, "Record", err)
	}
}

// read reads through c, action after action, until done is closed: what the console
// and the executor's callers ask. An action not recorded yet is not found, which is no
// failure.
func (w *mixedWorkload) read(ctx context.Context, c eventsv1connect.EventsServiceClient, version string, done <-chan struct{}, fail func(string, string, error)) {
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		id := w.ids[i%len(w.ids)]
		call := func(name string, f func(context.Context) error) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := f(ctx); err != nil && !errors.Is(err, context.Canceled) && connect.CodeOf(err) != connect.CodeNotFound {
				fail(version, name, err)
			}
		}
		call("GetAction", func(ctx context.Context) error {
			_, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
			return err
		})
		call("ListActionEvents", func(ctx context.Context) error {
			_, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: 100}))
			return err
		})
		call("ListActions", func(ctx context.Context) error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: id.GetProject(), Domain: id.GetDomain(), PageSize: 50}))
			return err
		})
	}
}

// migrateTo applies the store's migrations up to and including version (0: all of them).
func migrateTo(ctx context.Context, pool *pgxpool.Pool, version int64) error {
	all := store.Migrations()
	files, err := fs.Glob(all.FS, "*.sql")
	if err != nil {
		return err
	}
	some := fstest.MapFS{}
	for _, name := range files {
		var v int64
		if _, err := fmt.Sscanf(name, "%d_", &v); err != nil {
			return err
		}
		if version > 0 && v > version {
			continue
		}
		b, err := fs.ReadFile(all.FS, name)
		if err != nil {
			return err
		}
		some[name] = &fstest.MapFile{Data: b}
	}
	// One try: a step that gives up on its lock returns at once, where the services'
	// runner would try again for minutes (services/postgres tests that).
	r := postgres.Runner{RetryFor: time.Nanosecond, Log: slog.New(slog.DiscardHandler)}
	_, err = r.Apply(ctx, pool, postgres.Migrations{Service: all.Service, FS: some})
	return err
}

// A step that cannot have its lock within lock_timeout, because a transaction holds the
// table, gives up instead of queueing every call behind it; run again, the migration
// goes on from that step. A concurrent index build that failed (it leaves an invalid
// index) is built again when its file runs again.
func TestMigrationStepsGiveUpOnABusyTableAndRunAgain(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	pool, err := postgres.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := migrateTo(ctx, pool, 2); err != nil { // v0.1.0's schema
		t.Fatal(err)
	}

	busy, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := busy.Exec(ctx, "SELECT count(*) FROM action_events"); err != nil { // a read still open
		t.Fatal(err)
	}
	err = migrateTo(ctx, pool, 0)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.LockNotAvailable {
		t.Fatalf("migrating beside a transaction holding action_events: %v; want a lock timeout", err)
	}
	if err := busy.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var version int64
	pgtest.QueryRow(t, db, "SELECT max(version_id) FROM events_schema_version", &version)
	if version != 5 {
		t.Fatalf("the migration stopped after version %d; want 5 (actions' step), then action_events' step given up", version)
	}

	// The index build of 00007 failed once: its index is left invalid.
	if err := migrateTo(ctx, pool, 7); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'action_events_filed_key'::regclass")
	pgtest.Exec(t, db, "DELETE FROM events_schema_version WHERE version_id = 7")
	if err := migrateTo(ctx, pool, 0); err != nil {
		t.Fatalf("migrating again: %v", err)
	}
	var partitioned, valid bool
	pgtest.QueryRow(t, db, `SELECT c.relkind = 'p', i.indisvalid FROM pg_class c, pg_index i
WHERE c.relname = 'action_events' AND i.indexrelid = 'action_events_before_partitioning_pkey'::regclass`, &partitioned, &valid)
	if !partitioned || !valid {
		t.Fatalf("after running again: action_events partitioned %t, the old table's key valid %t; want both", partitioned, valid)
	}
}

// The previous release's retention (it deletes finished actions and their events by
// key, every interval) runs beside the tree's, which drops partitions, the one from
// before partitioning first: neither fails, every finished action goes, and every
// unfinished one stays whole, readable through both versions.
func TestPreviousReleaseRetentionBesideTheTrees(t *testing.T) {
	ctx := context.Background()
	binary, err := eventsrelease.Binary(ctx, previousRelease)
	if err != nil {
		t.Fatal(err)
	}
	db := pg.NewDatabase(t)
	old, logPath := startPrevious(t, binary, db, "--retention-ttl", "1ms", "--retention-interval", "50ms")
	pool, err := postgres.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Recorded before the migration: finished and unfinished actions.
	now := time.Now()
	var finished, unfinished []*flytecorev1.ActionIdentifier
	recordThrough := func(c eventsv1connect.EventsServiceClient, st *store.Store, run string) {
		for i := range 20 {
			id := actionID(run, fmt.Sprintf("a%d", i))
			evs := []*eventsv1.ActionEvent{occurredAt(event(id, 1, queued, 0, 0), now), occurredAt(event(id, 1, running, 0, 0), now)}
			if i%2 == 0 {
				evs = append(evs, occurredAt(event(id, 1, succeeded, 0, 0), now))
				finished = append(finished, id)
			} else {
				unfinished = append(unfinished, id)
			}
			if c != nil {
				if _, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: evs})); err != nil {
					t.Fatalf("%s Record: %v", previousRelease, err)
				}
			} else {
				storeRecord(t, st, evs...)
			}
		}
	}
	recordThrough(old.Client, nil, "before")
	if err := migrateTo(ctx, pool, 0); err != nil {
		t.Fatal(err)
	}
	// Partitions a second wide, so that retention reaches them in the test's time.
	st := store.New(pool, store.Options{PartitionWidth: time.Second, UnfinishedTTL: time.Hour})
	if _, err := st.MaintainPartitions(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	recordThrough(old.Client, nil, "after-old")
	recordThrough(nil, st, "after-tree")

	// The tree's retention, with a TTL of two seconds, while the old one keeps deleting:
	// the partition from before partitioning goes, and those of the first seconds.
	eventually.True(t, 30*time.Second, func() bool {
		if _, err := st.MaintainPartitions(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := st.DropExpired(ctx, time.Now(), 2*time.Second, 7); err != nil {
			t.Fatalf("the tree's retention beside the old one: %v", err)
		}
		return !strings.Contains(strings.Join(partitionNames(t, st), " "), "before_partitioning")
	}, func() string {
		return fmt.Sprintf("the table from before partitioning is still a partition: %v", partitionNames(t, st))
	})
	// The previous release goes on recording new actions after that partition went.
	recordThrough(old.Client, nil, "after-drop")
	eventually.True(t, 30*time.Second, func() bool {
		var left int
		pgtest.QueryRow(t, db, "SELECT count(*) FROM actions WHERE rank = 5", &left)
		return left == 0
	}, func() string { return "finished actions are left" })
	for _, c := range []eventsv1connect.EventsServiceClient{old.Client, nil} {
		for _, id := range finished {
			if c != nil {
				if _, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id})); connect.CodeOf(err) != connect.CodeNotFound {
					t.Errorf("%s: the finished %s is still there (%v)", previousRelease, store.KeyOf(id), err)
				}
			} else if n := eventsOf(t, st, event(id, 1, queued, 0, 0)); n != 0 {
				t.Errorf("tree: the finished %s lists %d events", store.KeyOf(id), n)
			}
		}
		for _, id := range unfinished {
			if c != nil {
				evs, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: 100}))
				if err != nil || len(evs.Msg.GetEvents()) != 2 {
					t.Errorf("%s: the unfinished %s lists %d events (%v); want 2", previousRelease, store.KeyOf(id), len(evs.Msg.GetEvents()), err)
				}
			} else if n := eventsOf(t, st, event(id, 1, queued, 0, 0)); n != 2 {
				t.Errorf("tree: the unfinished %s lists %d events; want 2", store.KeyOf(id), n)
			}
		}
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "deleting finished actions") {
		t.Errorf("the %s retention failed:\n%s", previousRelease, tail(b, 4000))
	}
}
