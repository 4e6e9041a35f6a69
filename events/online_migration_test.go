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
	"github.com/jackc/pgx/v5"
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
const previousRelease = "v0.3.0"

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

// lastFromV010 is the newest migration a v0.1.0 or v0.2.0 database reaches in place:
// v0.3.0's schema. The tree's 00018 needs what v0.3.0's service then does in the
// background (completeAsV030).
const lastFromV010 = 17

// completeAsV030 does what v0.3.0's events service does in the background before
// migration 00018 may run (its store.CompleteClusterKeys): it keys each partition of
// action_events with the cluster, and gives each action an older release recorded the
// cluster its event names, with its events.
func completeAsV030(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'action_events'::regclass AND NOT EXISTS (
			SELECT FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
			WHERE ii.inhparent = 'action_events_cluster_key'::regclass AND x.indrelid = c.oid)`)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		index := pgx.Identifier{p + "_cluster_key"}.Sanitize()
		if _, err := pool.Exec(ctx, "CREATE UNIQUE INDEX "+index+" ON "+pgx.Identifier{p}.Sanitize()+
			" (project, domain, run, action, attempt, phase, version, filed_at, cluster) NULLS NOT DISTINCT"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "ALTER INDEX action_events_cluster_key ATTACH PARTITION "+index); err != nil {
			t.Fatal(err)
		}
	}
	rows, err = pool.Query(ctx, `SELECT id, event FROM actions WHERE cluster IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	type nameless struct {
		id    int64
		event []byte
	}
	actions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (n nameless, err error) {
		err = r.Scan(&n.id, &n.event)
		return n, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range actions {
		var ev eventsv1.ActionEvent
		if err := proto.Unmarshal(a.event, &ev); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `WITH done AS (
				UPDATE actions SET cluster = $2 WHERE id = $1 RETURNING project, domain, run, action, filed_at)
			UPDATE action_events e SET cluster = $2 FROM done d
			WHERE (e.project, e.domain, e.run, e.action, e.filed_at) = (d.project, d.domain, d.run, d.action, d.filed_at) AND e.cluster IS NULL`,
			a.id, ev.GetCluster()); err != nil {
			t.Fatal(err)
		}
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
	err = migrateTo(ctx, pool, lastFromV010)
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
	if err := migrateTo(ctx, pool, lastFromV010); err != nil {
		t.Fatalf("migrating again: %v", err)
	}
	var partitioned, valid bool
	pgtest.QueryRow(t, db, `SELECT c.relkind = 'p', i.indisvalid FROM pg_class c, pg_index i
WHERE c.relname = 'action_events' AND i.indexrelid = 'action_events_before_partitioning_pkey'::regclass`, &partitioned, &valid)
	if !partitioned || !valid {
		t.Fatalf("after running again: action_events partitioned %t, the old table's key valid %t; want both", partitioned, valid)
	}
}
