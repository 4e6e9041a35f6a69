package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/flytekube/backend/events/outbox"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

func TestNothingQueuesWithoutASink(t *testing.T) {
	e := newEnv(t)
	e.record(t, event("r1", "a0", 0), event("r1", "a0", 1))
	if n := e.queued(t); n != 0 {
		t.Fatalf("%d entries queued with no sink registered; want 0", n)
	}

	e.register(t, "http")
	e.record(t, event("r1", "a0", 2))
	got := e.drain(t, "http")
	if want := []string{eventName(event("r1", "a0", 2))}; !slices.Equal(names(got), want) {
		t.Fatalf("after registering: read %q; want only the event recorded since, %q", names(got), want)
	}
}

func TestDuplicatesQueueOnce(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	first := []*eventsv1.ActionEvent{event("r1", "a0", 0), event("r1", "a0", 1), event("r1", "a1", 0)}
	e.record(t, first...)
	// Redelivered whole (the copy fails, the insert absorbs all), then with a new event
	// among the old ones (the insert keeps only the new).
	if res := e.record(t, first...); res.Recorded != 0 {
		t.Fatalf("redelivery recorded %d events; want 0", res.Recorded)
	}
	if res := e.record(t, append(first, event("r1", "a0", 2))...); res.Recorded != 1 {
		t.Fatalf("redelivery with one new event recorded %d; want 1", res.Recorded)
	}
	// Repeated within one batch.
	e.record(t, event("r1", "a1", 1), event("r1", "a1", 1))

	want := []string{
		eventName(first[0]), eventName(first[1]), eventName(first[2]),
		eventName(event("r1", "a0", 2)), eventName(event("r1", "a1", 1)),
	}
	if got := names(e.drain(t, "http")); !slices.Equal(got, want) {
		t.Fatalf("read %q; want each new event once, in order: %q", got, want)
	}
}

func TestEntriesCarryTheEvent(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	before := time.Now()
	ev := event("r1", "a0", 3)
	e.record(t, ev)
	got := e.read(t, "http", 10)
	if len(got) != 1 {
		t.Fatalf("read %d entries; want 1", len(got))
	}
	en := got[0]
	if en.Event == nil || en.DecodeErr != nil {
		t.Fatalf("entry has no event: %v", en.DecodeErr)
	}
	if eventName(en.Event) != name(en) || en.Event.GetReason() != ev.GetReason() {
		t.Errorf("entry %s carries event %s (%q)", name(en), eventName(en.Event), en.Event.GetReason())
	}
	if !en.OccurredAt.Equal(ev.GetOccurredAt().AsTime()) {
		t.Errorf("occurred at %s; want %s", en.OccurredAt, ev.GetOccurredAt().AsTime())
	}
	if en.RecordedAt.Before(before.Add(-time.Second)) || en.RecordedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("recorded at %s; want about now", en.RecordedAt)
	}
	if en.Position.Tx == 0 || en.Position.Pos == 0 {
		t.Errorf("position %s is not set", en.Position)
	}
}

// The trigger numbers a statement's rows in the order they were inserted, which is
// Record's order: by action, then as the action's events fold. A batch given shuffled,
// through the copy and through the redelivery insert, comes out in that order.
func TestBatchQueuesInFoldOrder(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	retry := event("r1", "a0", 0)
	retry.Attempt = 2 // a second attempt's first event follows the first attempt's last
	var want []string
	var batch []*eventsv1.ActionEvent
	for _, action := range []string{"a0", "a1"} {
		for i := range lifecycle {
			ev := event("r1", action, i)
			batch = append(batch, ev)
			want = append(want, eventName(ev))
		}
	}
	want = slices.Insert(want, len(lifecycle), eventName(retry))
	batch = append(batch, retry)

	rng := rand.New(rand.NewPCG(1, 2))
	for _, path := range []string{"copy", "insert"} {
		if path == "insert" {
			// A redelivery of the first half with the second half new: the insert path.
			e.record(t, batch[:len(batch)/2]...)
			e.drain(t, "http")
		}
		shuffled := slices.Clone(batch)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		e.record(t, shuffled...)
		got := names(e.drain(t, "http"))
		if path == "copy" {
			if !slices.Equal(got, want) {
				t.Fatalf("%s: read %q; want fold order %q", path, got, want)
			}
			if _, err := e.pool.Exec(context.Background(), "TRUNCATE action_events, actions"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var rest []string
		for _, n := range want {
			if !slices.ContainsFunc(batch[:len(batch)/2], func(ev *eventsv1.ActionEvent) bool { return eventName(ev) == n }) {
				rest = append(rest, n)
			}
		}
		if !slices.Equal(got, rest) {
			t.Fatalf("%s: read %q; want the new events in fold order %q", path, got, rest)
		}
	}
}

// Sixteen writers record their own actions' events, each Record after the previous one
// returned, as the executor sends them, while a reader drains the outbox: every event
// comes out exactly once, and each action's in the order recorded.
func TestConcurrentWritersReadExactlyOnceInOrder(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	const (
		writers          = 16
		actionsPerWriter = 6
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	recorded := make([][]string, writers) // each writer's events, in the order recorded
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			next := make([]int, actionsPerWriter) // each action's next lifecycle step
			for {
				// A batch takes the next one or two events of a few of the writer's actions.
				var batch []*eventsv1.ActionEvent
				for a := range actionsPerWriter {
					for range rng.IntN(3) {
						if next[a] < len(lifecycle) {
							batch = append(batch, event(fmt.Sprintf("w%d", w), fmt.Sprintf("a%d", a), next[a]))
							next[a]++
						}
					}
				}
				if len(batch) == 0 {
					if slices.Min(next) == len(lifecycle) {
						return
					}
					continue
				}
				if _, err := e.store.Record(ctx, batch); err != nil {
					errs <- err
					return
				}
				for _, ev := range batch {
					recorded[w] = append(recorded[w], eventName(ev))
				}
			}
		})
	}

	var read []outbox.Entry
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for finished := false; ; {
		entries, err := e.box.Read(ctx, "http", 50)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) > 0 {
			read = append(read, entries...)
			if err := e.box.Advance(ctx, "http", entries[len(entries)-1].Position); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if finished {
			break
		}
		select {
		case <-done:
			finished = true // one more pass reads what the last writers committed
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	seen := map[string]int{}
	perAction := map[string][]string{}
	for _, en := range read {
		seen[name(en)]++
		perAction[en.Key.String()] = append(perAction[en.Key.String()], name(en))
	}
	total := 0
	for w := range writers {
		wantPerAction := map[string][]string{}
		for _, n := range recorded[w] {
			total++
			if seen[n] != 1 {
				t.Errorf("%s read %d times; want once", n, seen[n])
			}
		}
		for a := range actionsPerWriter {
			key := fmt.Sprintf("demo/development/w%d/a%d", w, a)
			for i := range lifecycle {
				wantPerAction[key] = append(wantPerAction[key], eventName(event(fmt.Sprintf("w%d", w), fmt.Sprintf("a%d", a), i)))
			}
			if !slices.Equal(perAction[key], wantPerAction[key]) {
				t.Errorf("%s read in the order %q; want %q", key, perAction[key], wantPerAction[key])
			}
		}
	}
	if len(read) != total || total != writers*actionsPerWriter*len(lifecycle) {
		t.Errorf("read %d entries of %d recorded events; want %d", len(read), total, writers*actionsPerWriter*len(lifecycle))
	}
	for i := 1; i < len(read); i++ {
		if read[i-1].Position.Compare(read[i].Position) >= 0 {
			t.Fatalf("entry %d at %s does not follow entry %d at %s", i, read[i].Position, i-1, read[i-1].Position)
		}
	}
}

// insertEvent writes an event straight into action_events within tx, as Record's copy
// does, so the test decides when the transaction commits.
func insertEvent(t *testing.T, tx pgx.Tx, run string) {
	t.Helper()
	encoded, err := proto.Marshal(event(run, "a0", 0))
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(context.Background(), `INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event, filed_at)
		VALUES ('demo', 'development', $1, 'a0', 1, 1, 0, now(), $2, '-infinity')`, run, encoded)
	if err != nil {
		t.Fatal(err)
	}
}

// Transaction A queues an entry first (the lower position) and commits after transaction
// B, which queued later: B's entry must not be read past A's while A is open, or the
// cursor would pass A's entry, which then never comes out.
func TestLateCommitIsNotSkipped(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	ctx := context.Background()

	a, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Rollback(ctx) }()
	insertEvent(t, a, "early")
	b, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insertEvent(t, b, "late")
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	if got := e.read(t, "http", 10); len(got) != 0 {
		e.advance(t, "http", got[len(got)-1].Position)
		t.Errorf("while A is open, read %q; want nothing (B committed, but A's earlier entry may still come)", names(got))
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := e.drain(t, "http")
	want := []string{"demo/development/early/a0/1/ACTION_PHASE_QUEUED/0", "demo/development/late/a0/1/ACTION_PHASE_QUEUED/0"}
	if !slices.Equal(names(got), want) {
		t.Fatalf("after A committed, read %q; want %q, none skipped", names(got), want)
	}
}

// The leader's registration adds its sinks and keeps the cursor of one it does not know
// until no replica has been configured with it for forgetAfter: a rollout adding a sink
// runs leaders of the old configuration beside replicas of the new.
func TestRegisterSinks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if ch := e.register(t, "a", "b"); !slices.Equal(ch.Added, []string{"a", "b"}) || len(ch.Removed) != 0 {
		t.Fatalf("first registration: %+v; want a and b added", ch)
	}
	e.record(t, event("r1", "a0", 0))
	if ch := e.register(t, "b", "c"); !slices.Equal(ch.Added, []string{"c"}) || len(ch.Removed) != 0 {
		t.Fatalf("second registration: %+v; want c added and a, configured a moment ago, kept", ch)
	}
	if got := e.drain(t, "a"); len(got) != 1 {
		t.Errorf("a, which a leader without it kept, read %q; want its pending event", names(got))
	}
	e.unconfigured(t, "a")
	if ch := e.register(t, "b", "c"); len(ch.Added) != 0 || !slices.Equal(ch.Removed, []string{"a"}) {
		t.Fatalf("registration once a was unconfigured for long: %+v; want a removed", ch)
	}
	if got := e.drain(t, "b"); len(got) != 1 {
		t.Errorf("b, which stayed, read %q; want its pending event", names(got))
	}
	if got := e.drain(t, "c"); len(got) != 0 {
		t.Errorf("c, new, read %q; want nothing recorded before it", names(got))
	}
	if _, err := e.box.Read(ctx, "a", 10); !errors.Is(err, outbox.ErrUnknownSink) {
		t.Errorf("Read of a removed sink: %v; want ErrUnknownSink", err)
	}
	if err := e.box.Advance(ctx, "a", outbox.Position{Tx: 1, Pos: 1}); !errors.Is(err, outbox.ErrUnknownSink) {
		t.Errorf("Advance of a removed sink: %v; want ErrUnknownSink", err)
	}
	if _, err := e.box.RegisterSinks(ctx, []string{""}, forgetAfter); err == nil {
		t.Error("an empty sink name was accepted")
	}
	if ch := e.register(t); len(ch.Removed) != 0 {
		t.Errorf("registering none: %+v; want b and c, configured a moment ago, kept", ch)
	}
	e.unconfigured(t, "b", "c")
	if ch, err := e.box.RegisterSinks(ctx, nil, 0); err != nil || len(ch.Removed) != 0 {
		t.Errorf("registering none, forgetting never: %+v, %v; want nothing removed", ch, err)
	}
	if ch := e.register(t); !slices.Equal(ch.Removed, []string{"b", "c"}) {
		t.Errorf("registering none once b and c were unconfigured for long: %+v; want both removed", ch)
	}
}

// UnregisterSinks, the explicit step, removes the named cursors at once.
func TestUnregisterSinks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register(t, "a", "b")
	removed, err := e.box.UnregisterSinks(ctx, []string{"a", "gone"})
	if err != nil || !slices.Equal(removed, []string{"a"}) {
		t.Fatalf("UnregisterSinks(a, gone) = %v, %v; want a removed", removed, err)
	}
	if _, err := e.box.Read(ctx, "a", 10); !errors.Is(err, outbox.ErrUnknownSink) {
		t.Errorf("Read of an unregistered sink: %v; want ErrUnknownSink", err)
	}
	if _, err := e.box.Read(ctx, "b", 10); err != nil {
		t.Errorf("b, not named, was removed: %v", err)
	}
	if _, err := e.box.UnregisterSinks(ctx, []string{""}); err == nil {
		t.Error("an empty sink name was accepted")
	}
}

// AddSinks, which every replica runs at start, adds and never removes or moves a cursor.
func TestAddSinks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register(t, "a")
	e.record(t, event("r1", "a0", 0))
	added, err := e.box.AddSinks(ctx, []string{"a", "b"})
	if err != nil || !slices.Equal(added, []string{"b"}) {
		t.Fatalf("AddSinks(a, b) = %v, %v; want b added", added, err)
	}
	e.record(t, event("r1", "a0", 1))
	if got := e.drain(t, "a"); len(got) != 2 {
		t.Errorf("a, already there, read %q; want both events", names(got))
	}
	if got := e.drain(t, "b"); len(got) != 1 {
		t.Errorf("b, added between them, read %q; want the second event", names(got))
	}
	if added, err := e.box.AddSinks(ctx, []string{"b"}); err != nil || len(added) != 0 {
		t.Errorf("AddSinks(b) again = %v, %v; want nothing added", added, err)
	}
	if _, err := e.box.Read(ctx, "a", 1); err != nil {
		t.Errorf("a, not named the second time, was removed: %v", err)
	}
	if _, err := e.box.AddSinks(ctx, []string{""}); err == nil {
		t.Error("an empty sink name was accepted")
	}
}

func TestAdvanceNeverMovesBack(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	e.record(t, event("r1", "a0", 0))
	e.record(t, event("r1", "a0", 1))
	all := e.read(t, "http", 10)
	if len(all) != 2 {
		t.Fatalf("read %d entries; want 2", len(all))
	}
	e.advance(t, "http", all[1].Position)
	e.advance(t, "http", all[0].Position)
	if got := e.read(t, "http", 10); len(got) != 0 {
		t.Fatalf("after advancing past both and then back to the first, read %q; want nothing", names(got))
	}
}

func TestTrim(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register(t, "fast", "slow")
	for i := range lifecycle {
		e.record(t, event("r1", "a0", i))
	}
	e.drain(t, "fast")
	slow := e.read(t, "slow", 2)
	e.advance(t, "slow", slow[1].Position)

	n, err := e.box.Trim(ctx, 1) // one at a time, to see the batches add up
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || e.queued(t) != 3 {
		t.Fatalf("Trim deleted %d, leaving %d; want the 2 entries both sinks passed deleted", n, e.queued(t))
	}
	if got := e.read(t, "slow", 10); len(got) != 3 {
		t.Fatalf("slow reads %d entries after Trim; want its 3 pending", len(got))
	}

	// Removed, the slow sink no longer holds trimming back.
	e.unconfigured(t, "slow")
	e.register(t, "fast")
	if n, err := e.box.Trim(ctx, 100); err != nil || n != 3 || e.queued(t) != 0 {
		t.Fatalf("Trim after removing slow: %d, %v, %d left; want 3 deleted, none left", n, err, e.queued(t))
	}

	// A row (one Record's events) goes once its last event is passed.
	e.record(t, event("r2", "a0", 0), event("r2", "a0", 1), event("r2", "a0", 2))
	two := e.read(t, "fast", 2)
	e.advance(t, "fast", two[1].Position)
	if n, err := e.box.Trim(ctx, 100); err != nil || n != 0 || e.queued(t) != 3 {
		t.Fatalf("Trim with a row partly passed: %d rows, %v, %d events left; want none deleted", n, err, e.queued(t))
	}
	e.drain(t, "fast")
	if n, err := e.box.Trim(ctx, 100); err != nil || n != 1 || e.queued(t) != 0 {
		t.Fatalf("Trim with the row passed: %d rows, %v, %d events left; want it deleted", n, err, e.queued(t))
	}

	// With no sink, everything goes.
	e.record(t, event("r3", "a0", 0), event("r3", "a0", 1))
	e.record(t, event("r3", "a0", 2))
	e.unconfigured(t, "fast")
	e.register(t)
	if n, err := e.box.Trim(ctx, 100); err != nil || n != 2 || e.queued(t) != 0 {
		t.Fatalf("Trim with no sink: %d rows, %v, %d events left; want both rows deleted, none left", n, err, e.queued(t))
	}
}

// Read's limit counts events, so one Record's row may be read over several calls.
func TestReadSplitsARow(t *testing.T) {
	e := newEnv(t)
	e.register(t, "http")
	var batch []*eventsv1.ActionEvent
	var want []string
	for a := range 4 {
		for i := range 3 {
			ev := event("r1", fmt.Sprintf("a%d", a), i)
			batch = append(batch, ev)
			want = append(want, eventName(ev))
		}
	}
	e.record(t, batch...)
	e.record(t, event("r1", "a0", 3))
	want = append(want, eventName(event("r1", "a0", 3)))

	var got []outbox.Entry
	for {
		entries := e.read(t, "http", 5)
		if len(entries) == 0 {
			break
		}
		if len(got)+len(entries) < len(want) && len(entries) != 5 {
			t.Fatalf("read %d entries with %d pending; want 5", len(entries), len(want)-len(got))
		}
		got = append(got, entries...)
		e.advance(t, "http", entries[len(entries)-1].Position)
	}
	if !slices.Equal(names(got), want) {
		t.Fatalf("read %q; want %q", names(got), want)
	}
	for i, en := range got[:12] {
		if en.Position.Ordinal != int32(i+1) || en.Position.Pos != got[0].Position.Pos {
			t.Fatalf("entry %d at %s; want ordinal %d of the first row", i, en.Position, i+1)
		}
	}
	if last := got[12].Position; last.Ordinal != 1 || last.Compare(got[11].Position) <= 0 {
		t.Fatalf("the second Record's event at %s; want the first of a later row", last)
	}
}

func TestLag(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register(t, "http")
	if n, oldest, err := e.box.Lag(ctx, "http"); err != nil || n != 0 || !oldest.IsZero() {
		t.Fatalf("Lag of an empty outbox: %d, %s, %v; want 0, zero time", n, oldest, err)
	}
	before := time.Now()
	e.record(t, event("r1", "a0", 0), event("r1", "a1", 0))
	e.record(t, event("r1", "a0", 1))
	n, oldest, err := e.box.Lag(ctx, "http")
	if err != nil || n != 3 || oldest.Before(before.Add(-time.Second)) || oldest.After(time.Now()) {
		t.Fatalf("Lag: %d, %s, %v; want 3 since about %s", n, oldest, err, before)
	}
	got := e.read(t, "http", 2)
	e.advance(t, "http", got[1].Position)
	if n, _, _ := e.box.Lag(ctx, "http"); n != 1 {
		t.Fatalf("Lag after advancing past 2 of 3: %d; want 1", n)
	}
	if _, _, err := e.box.Lag(ctx, "nope"); !errors.Is(err, outbox.ErrUnknownSink) {
		t.Fatalf("Lag of an unknown sink: %v; want ErrUnknownSink", err)
	}
}

// RenameSinks moves a sink's cursor and dead letters to its new name, keeping its place:
// a sink whose default name changed loses no pending event and no dead letter, and a
// cursor made under the new name meanwhile (by a replica already upgraded) gives way to
// the older one.
func TestRenameSinks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register(t, "old", "both-old", "both-new")
	e.record(t, event("r1", "a0", 0))
	e.record(t, event("r1", "a0", 1))
	letters := e.deadLetters(t, "old", "r2", 1)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters made; want 1", len(letters))
	}
	e.advance(t, "both-new", e.read(t, "both-new", 10)[1].Position)
	renames := map[string]string{"old": "new", "both-old": "both-new", "absent": "still-absent"}
	for range 2 { // the second finds nothing to move
		if _, _, err := e.box.RenameSinks(ctx, renames); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.drain(t, "new"); len(got) != 2 {
		t.Errorf("the renamed sink read %q; want its two pending events", names(got))
	}
	if got := e.drain(t, "both-new"); len(got) != 3 {
		t.Errorf("the sink renamed onto a newer cursor read %q; want all three events, from the older cursor", names(got))
	}
	for _, gone := range []string{"old", "both-old", "still-absent"} {
		if _, err := e.box.Read(ctx, gone, 1); !errors.Is(err, outbox.ErrUnknownSink) {
			t.Errorf("Read(%s): %v; want ErrUnknownSink", gone, err)
		}
	}
	if n, err := e.box.CountDeadLetters(ctx, "new"); err != nil || n != 1 {
		t.Errorf("dead letters under the new name: %d, %v; want 1", n, err)
	}
	if n, err := e.box.CountDeadLetters(ctx, "old"); err != nil || n != 0 {
		t.Errorf("dead letters under the old name: %d, %v; want none", n, err)
	}
}
