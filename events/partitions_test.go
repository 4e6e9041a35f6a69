package events_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/events/store"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/metricstest"
	"github.com/flytekube/backend/test/pgtest"
)

// day0 is a noon after the migrations ran: the first partition holds every earlier time.
var day0 = time.Now().UTC().AddDate(0, 0, 30).Truncate(24 * time.Hour).Add(12 * time.Hour)

// openStoreAt opens a store whose filing clock the test moves.
func openStoreAt(t *testing.T, dbURL string, clk *clocktesting.FakeClock) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	_, pool := openStore(t, dbURL)
	st := store.New(pool, store.Options{Clock: clk})
	if _, err := st.MaintainPartitions(context.Background(), clk.Now()); err != nil {
		t.Fatal(err)
	}
	return st, pool
}

func storeRecord(t *testing.T, st *store.Store, evs ...*eventsv1.ActionEvent) store.RecordResult {
	t.Helper()
	res, err := st.Record(context.Background(), evs)
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	return res
}

func eventsOf(t *testing.T, st *store.Store, e *eventsv1.ActionEvent) int {
	t.Helper()
	got, _, err := st.ListActionEvents(context.Background(), storeKey(e), nil, store.EventCursor{}, store.Page{Limit: 1000, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return len(got)
}

func partitionNames(t *testing.T, st *store.Store) []string {
	t.Helper()
	parts, err := st.Partitions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range parts {
		names = append(names, p.Name)
	}
	return names
}

func occurredAt(e *eventsv1.ActionEvent, at time.Time) *eventsv1.ActionEvent {
	e.OccurredAt = timestamppb.New(at)
	return e
}

// Retention drops a day's partition with the actions that finished in it, and re-files
// the one still running, whose history stays whole, idempotent and unpublished.
func TestRetentionDropsPartitionsAndRefilesWhatRuns(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	clk := clocktesting.NewFakeClock(day0)
	st, pool := openStoreAt(t, db, clk)
	if _, err := outbox.New(pool).AddSinks(ctx, []string{"audit"}); err != nil {
		t.Fatal(err)
	}

	var finished []*eventsv1.ActionEvent
	for i := range 20 {
		id := actionID("day0", fmt.Sprintf("done%d", i))
		finished = append(finished, occurredAt(event(id, 1, running, 0, 0), day0), occurredAt(event(id, 1, succeeded, 0, 0), day0.Add(time.Minute)))
	}
	storeRecord(t, st, finished...)
	longRunning := []*eventsv1.ActionEvent{
		occurredAt(event(actionID("day0", "long"), 1, queued, 0, 0), day0),
		occurredAt(event(actionID("day0", "long"), 1, running, 0, 0), day0.Add(time.Second)),
	}
	storeRecord(t, st, longRunning...)
	day0Partition := partitionNames(t, st)[1] // after the one from before partitioning
	outboxBefore := outboxEvents(t, db)

	// Two days on, with a TTL of one: day 0's partition is past it.
	now := day0.Add(48 * time.Hour)
	clk.SetTime(now)
	if _, err := st.MaintainPartitions(ctx, now); err != nil {
		t.Fatal(err)
	}
	res, err := st.DropExpired(ctx, now, 24*time.Hour, 7) // several batches
	if err != nil {
		t.Fatal(err)
	}
	if res.Actions != 20 || res.Refiled != 1 || res.Partitions < 2 {
		t.Fatalf("retention did %+v; want 20 actions deleted, 1 re-filed, day 0's partition and the first dropped", res)
	}
	if names := partitionNames(t, st); strings.Contains(strings.Join(names, " "), day0Partition) {
		t.Fatalf("partitions %v still hold %s", names, day0Partition)
	}
	for _, e := range finished {
		if _, err := st.GetAction(ctx, storeKey(e), nil); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetAction(%s) = %v; want ErrNotFound", storeKey(e), err)
		}
	}
	if n := eventsOf(t, st, longRunning[0]); n != 2 {
		t.Fatalf("the re-filed action lists %d events; want 2", n)
	}
	if got := outboxEvents(t, db); got != outboxBefore {
		t.Fatalf("re-filing queued %d events for the sinks; want none", got-outboxBefore)
	}
	// Its redelivered events are still recognised as such.
	if res := storeRecord(t, st, longRunning...); res.Duplicates != 2 || res.Recorded != 0 {
		t.Fatalf("redelivery after re-filing: %+v; want 2 duplicates", res)
	}

	// Once it finishes and a TTL passes, it goes too.
	storeRecord(t, st, occurredAt(event(actionID("day0", "long"), 1, succeeded, 0, 0), now))
	if n := eventsOf(t, st, longRunning[0]); n != 3 {
		t.Fatalf("the re-filed action lists %d events; want 3", n)
	}
	later := now.Add(72 * time.Hour)
	if _, err := st.MaintainPartitions(ctx, later); err != nil {
		t.Fatal(err)
	}
	if res, err := st.DropExpired(ctx, later, 24*time.Hour, 7); err != nil || res.Actions != 1 {
		t.Fatalf("retention did %+v (%v); want the last action deleted", res, err)
	}
	if evs, acts := countRows(t, db); evs+acts != 0 {
		t.Fatalf("%d events and %d actions left; want none", evs, acts)
	}
}

func outboxEvents(t *testing.T, dbURL string) int {
	t.Helper()
	var n int
	pgtest.QueryRow(t, dbURL, "SELECT coalesce(sum(count), 0) FROM event_outbox", &n)
	return n
}

// Records of actions that never finish race retention passes that re-file them again and
// again (a partition a second wide, a TTL of a second): no acknowledged event is lost,
// and none is stored twice. The seed is logged; TEST_SEED replays one.
func TestRefilingRacingRecordLosesNothing(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	_, pool := openStore(t, db)
	writer := store.New(pool, store.Options{PartitionWidth: time.Second})
	// The shortest hold, so that the actions are re-filed again and again; their events
	// occur now, so none is abandoned while it gets them.
	retention := store.New(pool, store.Options{PartitionWidth: time.Second, UnfinishedTTL: 2 * time.Second})
	if _, err := retention.MaintainPartitions(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed))

	stop := make(chan struct{})
	var (
		wg     sync.WaitGroup
		passes int
		res    store.RetentionResult
		retErr error
	)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			now := time.Now()
			if _, err := retention.MaintainPartitions(ctx, now); err != nil {
				retErr = err
				return
			}
			r, err := retention.DropExpired(ctx, now, time.Second, 3)
			if err != nil {
				retErr = err
				return
			}
			passes++
			res.Partitions += r.Partitions
			res.Refiled += r.Refiled
			time.Sleep(20 * time.Millisecond)
		}
	})

	const actions = 12
	acked := map[store.Key]int{}
	deadline := time.Now().Add(5 * time.Second)
	for version := 0; time.Now().Before(deadline); version++ {
		var batch []*eventsv1.ActionEvent
		for a := range actions {
			if rng.IntN(2) == 0 {
				continue
			}
			e := occurredAt(event(actionID("forever", fmt.Sprintf("a%d", a)), 1, running, uint32(version), version), time.Now())
			batch = append(batch, e)
			if rng.IntN(4) == 0 { // a redelivery in the same batch now and then
				batch = append(batch, proto.Clone(e).(*eventsv1.ActionEvent))
			}
		}
		if len(batch) == 0 {
			continue
		}
		if _, err := writer.Record(ctx, batch); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("seed %d: Record: %v", seed, err)
		}
		seen := map[string]bool{}
		for _, e := range batch {
			if id := fmt.Sprint(storeKey(e), e.GetVersion()); !seen[id] {
				seen[id] = true
				acked[storeKey(e)]++
			}
		}
	}
	close(stop)
	wg.Wait()
	if retErr != nil {
		t.Fatalf("seed %d: retention: %v", seed, retErr)
	}
	if res.Refiled == 0 || res.Partitions == 0 {
		t.Fatalf("seed %d: %d passes re-filed %d actions and dropped %d partitions; the race was not run", seed, passes, res.Refiled, res.Partitions)
	}
	for key, want := range acked {
		got, _, err := writer.ListActionEvents(ctx, key, nil, store.EventCursor{}, store.Page{Limit: 10000, MaxBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != want {
			t.Errorf("seed %d: %s lists %d events; %d were acknowledged", seed, key, len(got), want)
		}
	}
	var stored, all int
	pgtest.QueryRow(t, db, "SELECT count(*), (SELECT count(*) FROM action_events) FROM (SELECT DISTINCT project, domain, run, action, attempt, phase, version FROM action_events) e", &stored, &all)
	if stored != all {
		t.Errorf("seed %d: %d events stored under %d identities", seed, all, stored)
	}
	t.Logf("seed %d: %d passes, %d partitions dropped, %d re-filings", seed, passes, res.Partitions, res.Refiled)
}

// A database from before partitioning keeps its history through the migration, and its
// old table is dropped as a partition once what it holds has expired.
func TestMigrationToPartitionsKeepsHistory(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	pool, err := postgres.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	all := store.Migrations()
	before := fstest.MapFS{}
	for _, name := range []string{"00001_events.sql", "00002_outbox.sql"} {
		b, err := fs.ReadFile(all.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		before[name] = &fstest.MapFile{Data: b}
	}
	if _, err := postgres.Migrate(ctx, pool, postgres.Migrations{Service: all.Service, FS: before}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	// What Record wrote before, three days ago: the events and their fold.
	day0 := time.Now().Add(-72 * time.Hour)
	old := []*eventsv1.ActionEvent{
		occurredAt(event(actionID("old", "done"), 1, running, 0, 0), day0),
		occurredAt(event(actionID("old", "done"), 1, succeeded, 0, 0), day0.Add(time.Minute)),
		occurredAt(event(actionID("old", "running"), 1, running, 0, 0), day0),
	}
	for _, e := range old {
		b, err := proto.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		k := storeKey(e)
		if _, err := pool.Exec(ctx, `INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event)
VALUES ($1, $2, $3, $4, 1, $5, 0, $6, $7)`, k.Project, k.Domain, k.Run, k.Action, int16(e.GetPhase()), e.GetOccurredAt().AsTime(), b); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO actions (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event)
VALUES ($1, $2, $3, $4, 1, $5, 0, $6, $7, $7, $8)
ON CONFLICT (project, domain, run, action) DO UPDATE SET phase = EXCLUDED.phase, rank = EXCLUDED.rank, occurred_at = EXCLUDED.occurred_at, event = EXCLUDED.event`,
			k.Project, k.Domain, k.Run, k.Action, int16(e.GetPhase()), store.Rank(e.GetPhase()), e.GetOccurredAt().AsTime(), b); err != nil {
			t.Fatal(err)
		}
	}

	// To v0.3.0's schema, as v0.1.0's database upgrades in place, then what v0.3.0's
	// service completes in the background, then the rest.
	if err := migrateTo(ctx, pool, lastFromV010); err != nil {
		t.Fatal(err)
	}
	completeAsV030(t, pool)
	if err := migrateTo(ctx, pool, 0); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	st := store.New(pool, store.Options{Clock: clk, UnfinishedTTL: 30 * 24 * time.Hour})
	if _, err := st.MaintainPartitions(ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if n := eventsOf(t, st, old[0]); n != 2 {
		t.Fatalf("the old finished action lists %d events after the migration; want 2", n)
	}
	if res := storeRecord(t, st, old...); res.Duplicates != 3 {
		t.Fatalf("old events recorded again: %+v; want 3 duplicates", res)
	}
	if res := storeRecord(t, st, occurredAt(event(actionID("old", "running"), 1, running, 1, 0), day0)); res.Recorded != 1 {
		t.Fatalf("a new event of an old action: %+v; want it recorded", res)
	}
	if n := eventsOf(t, st, old[2]); n != 2 {
		t.Fatalf("the old running action lists %d events; want 2", n)
	}

	now := clk.Now().Add(48 * time.Hour)
	clk.SetTime(now)
	if _, err := st.MaintainPartitions(ctx, now); err != nil {
		t.Fatal(err)
	}
	res, err := st.DropExpired(ctx, now, 24*time.Hour, 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Actions != 1 || res.Refiled != 1 {
		t.Fatalf("retention did %+v; want the old finished action deleted and the running one re-filed", res)
	}
	if names := partitionNames(t, st); strings.Contains(strings.Join(names, " "), "before_partitioning") {
		t.Fatalf("the table from before partitioning is still a partition: %v", names)
	}
	if n := eventsOf(t, st, old[2]); n != 2 {
		t.Fatalf("the re-filed old action lists %d events; want 2", n)
	}
}

// The service makes its partitions before it serves and drops expired ones as it runs.
func TestServiceDropsExpiredPartitions(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db, func(c *events.Config) {
		c.PartitionWidth = time.Second
		c.RetentionTTL = time.Second
		c.RetentionUnfinishedTTL = time.Hour
		c.RetentionInterval = 100 * time.Millisecond
	})
	done := event(actionID("svc", "done"), 1, succeeded, 0, 0)
	done.OccurredAt = timestamppb.Now()
	stillRunning := event(actionID("svc", "running"), 1, running, 0, 0)
	stillRunning.OccurredAt = timestamppb.Now()
	record(t, inst.client, done, stillRunning)

	var evs, acts int
	eventually.True(t, 30*time.Second, func() bool { evs, acts = countRows(t, db); return evs == 1 && acts == 1 },
		func() string { return fmt.Sprintf("retention left %d events and %d actions; want 1 and 1", evs, acts) })
	getAction(t, inst.client, stillRunning.GetId())
	// Those ahead hold the running action until it would be abandoned (at most
	// MaxHoldPartitions); of those past, retention leaves few.
	st, _ := openStore(t, db)
	parts, err := st.Partitions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	past := 0
	for _, p := range parts {
		if p.To.Before(time.Now().Add(-5 * time.Second)) {
			past++
		}
	}
	if past > 2 || len(parts) > store.MaxHoldPartitions+6 {
		t.Errorf("%d partitions of one second are kept, %d more than 5 s past; want the present's, those ahead and at most a few past", len(parts), past)
	}
}

// The service deletes an unfinished action whose newest event is older than
// --retention-unfinished-ttl, counts it in a metric, and keeps a newer one.
func TestServiceDropsAbandonedActions(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db, func(c *events.Config) {
		c.PartitionWidth = time.Second
		c.RetentionTTL = time.Second
		c.RetentionUnfinishedTTL = time.Hour
		c.RetentionInterval = 100 * time.Millisecond
	})
	abandoned := event(actionID("svc", "abandoned"), 1, running, 0, 0)
	abandoned.OccurredAt = timestamppb.New(time.Now().Add(-2 * time.Hour))
	going := event(actionID("svc", "going"), 1, running, 0, 0)
	going.OccurredAt = timestamppb.Now()
	record(t, inst.client, abandoned, going)

	eventually.True(t, 30*time.Second, func() bool {
		return metricstest.Has(t, inst.Gatherer(), "flyte_events_retention_abandoned_actions_total 1")
	}, func() string { return "the abandoned action was never counted" })
	evs, acts := countRows(t, db)
	if evs != 1 || acts != 1 {
		t.Fatalf("retention left %d events and %d actions; want the going action's 1 and 1", evs, acts)
	}
	getAction(t, inst.client, going.GetId())
}

// testSeed is TEST_SEED when set, so that a failing run replays, else a fresh one.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv("TEST_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TEST_SEED: %v", err)
		}
		return seed
	}
	return rand.Uint64()
}

// Unfinished actions are moved out of an expiring partition once, to where they stay
// until they are abandoned: later passes move only what is new, however many unfinished
// actions are held.
func TestRetentionMovesAnUnfinishedActionOnce(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	clk := clocktesting.NewFakeClock(day0)
	_, pool := openStore(t, db)
	st := store.New(pool, store.Options{Clock: clk, UnfinishedTTL: 30 * 24 * time.Hour})
	if _, err := st.MaintainPartitions(ctx, day0); err != nil {
		t.Fatal(err)
	}
	const held = 10
	for i := range held {
		id := actionID("held", fmt.Sprintf("a%d", i))
		storeRecord(t, st, occurredAt(event(id, 1, queued, 0, 0), day0), occurredAt(event(id, 1, running, 0, 0), day0.Add(time.Minute)))
	}

	// A pass a day for a week, a TTL of one day: a new unfinished action each day.
	var perPass []int
	for day := 2; day <= 8; day++ {
		now := day0.Add(time.Duration(day) * 24 * time.Hour)
		clk.SetTime(now)
		storeRecord(t, st, occurredAt(event(actionID("daily", fmt.Sprintf("d%d", day)), 1, running, 0, 0), now))
		if _, err := st.MaintainPartitions(ctx, now); err != nil {
			t.Fatal(err)
		}
		res, err := st.DropExpired(ctx, now, 24*time.Hour, 4)
		if err != nil {
			t.Fatal(err)
		}
		perPass = append(perPass, res.Refiled)
	}
	// Day 2 moves the held ones; each later pass at most the one new action that
	// expired (a day's action is unfinished when its partition expires).
	if perPass[0] != held {
		t.Fatalf("the first pass moved %d actions; want the %d held (passes moved %v)", perPass[0], held, perPass)
	}
	for i, n := range perPass[1:] {
		if n > 1 {
			t.Fatalf("pass %d moved %d actions; want at most the day's new one, not the held ones again (passes moved %v)", i+2, n, perPass)
		}
	}
	for i := range held {
		if n := eventsOf(t, st, event(actionID("held", fmt.Sprintf("a%d", i)), 1, running, 0, 0)); n != 2 {
			t.Fatalf("held action a%d lists %d events; want 2", i, n)
		}
	}
}

// An unfinished action whose newest event is older than the bound is dropped with its
// events when retention reaches it; one with a newer event is kept.
func TestRetentionDropsAbandonedUnfinishedActions(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	clk := clocktesting.NewFakeClock(day0)
	_, pool := openStore(t, db)
	st := store.New(pool, store.Options{Clock: clk, UnfinishedTTL: 3 * 24 * time.Hour})
	if _, err := st.MaintainPartitions(ctx, day0); err != nil {
		t.Fatal(err)
	}
	stale := occurredAt(event(actionID("left", "stale"), 1, running, 0, 0), day0)
	lively := occurredAt(event(actionID("left", "lively"), 1, running, 0, 0), day0)
	storeRecord(t, st, stale, lively)

	pass := func(now time.Time) store.RetentionResult {
		t.Helper()
		clk.SetTime(now)
		if _, err := st.MaintainPartitions(ctx, now); err != nil {
			t.Fatal(err)
		}
		res, err := st.DropExpired(ctx, now, 24*time.Hour, 100)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// Two days on, both are a day past the TTL but within the bound: kept.
	if res := pass(day0.Add(48 * time.Hour)); res.Abandoned != 0 {
		t.Fatalf("retention at day 2 did %+v; want nothing abandoned", res)
	}
	// One goes on at day 3; at day 5 the other's newest event is past the bound.
	storeRecord(t, st, occurredAt(event(actionID("left", "lively"), 1, running, 1, 0), day0.Add(72*time.Hour)))
	var res store.RetentionResult
	for day := 3; day <= 6; day++ {
		r := pass(day0.Add(time.Duration(day) * 24 * time.Hour))
		res.Abandoned += r.Abandoned
	}
	if res.Abandoned != 1 {
		t.Fatalf("retention abandoned %d actions by day 6; want the stale one", res.Abandoned)
	}
	if _, err := st.GetAction(ctx, storeKey(stale), nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetAction(stale) = %v; want ErrNotFound", err)
	}
	if n := eventsOf(t, st, stale); n != 0 {
		t.Fatalf("the abandoned action lists %d events; want none", n)
	}
	if n := eventsOf(t, st, lively); n != 2 {
		t.Fatalf("the lively action lists %d events; want 2", n)
	}
}

// TestPartitionsTakeTurns: making and dropping partitions runs under
// postgres.LockEventsPartitions; while another session holds it, a replica skips its
// turn rather than wait, and the next turn after does the work.
func TestPartitionsTakeTurns(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	clk := clocktesting.NewFakeClock(day0)
	st, pool := openStoreAt(t, db, clk)
	before := partitionNames(t, st)

	other, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if err := postgres.Lock(ctx, other, postgres.LockEventsPartitions); err != nil {
		t.Fatal(err)
	}
	later := day0.Add(5 * 24 * time.Hour)
	made, err := st.MaintainPartitions(ctx, later)
	if err != nil || len(made) != 0 {
		t.Fatalf("MaintainPartitions while another session held the lock = %q, %v; want nothing made", made, err)
	}
	if res, err := st.DropExpired(ctx, later, time.Hour, 100); err != nil || res.Partitions != 0 {
		t.Fatalf("DropExpired while another session held the lock = %+v, %v; want nothing dropped", res, err)
	}
	if got := partitionNames(t, st); !slices.Equal(got, before) {
		t.Fatalf("partitions changed while another session held the lock: %q, were %q", got, before)
	}

	if err := postgres.Unlock(ctx, other, postgres.LockEventsPartitions); err != nil {
		t.Fatal(err)
	}
	if made, err := st.MaintainPartitions(ctx, later); err != nil || len(made) == 0 {
		t.Fatalf("MaintainPartitions once the lock was free = %q, %v; want partitions made", made, err)
	}
}
