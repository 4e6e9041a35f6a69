package events_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
)

// With NotifyAfterCommit, Record announces changed actions after its transaction
// commits, and concurrent Records share notifications: a NOTIFY inside each Record's
// transaction holds Postgres's notification lock through every commit, one after
// another. Every change is still announced.
func TestConcurrentRecordsShareNotifications(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	_, pool := openStore(t, db)
	st := store.New(pool, store.Options{NotifyAfterCommit: true})
	listener, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(ctx) }()
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{store.NotifyChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	const writers, records = 16, 200
	next := make(chan int, records)
	for i := range records {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for i := range next {
				if _, err := st.Record(ctx, []*eventsv1.ActionEvent{event(actionID("shared", fmt.Sprintf("a%d", i)), 1, running, 0, 0)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()

	announced := map[string]bool{}
	notifications := 0
	for len(announced) < records {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listener.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("%d of %d changes announced in %d notifications: %v", len(announced), records, notifications, err)
		}
		notifications++
		for _, k := range strings.Split(n.Payload, "\n") {
			announced[k] = true
		}
	}
	if notifications >= records {
		t.Fatalf("%d Records made %d notifications; want fewer, shared", records, notifications)
	}
	t.Logf("%d Records from %d writers announced in %d notifications", records, writers, notifications)
}

// cutAnnouncements returns a store over db whose announcements never reach Postgres's
// notification queue, as if its replica died right after its writes committed: its
// sessions find a pg_notify of the test's that refuses before the built-in one.
func cutAnnouncements(t *testing.T, db string, opts store.Options) *store.Store {
	t.Helper()
	pgtest.Exec(t, db, `CREATE SCHEMA IF NOT EXISTS notify_cut;
CREATE OR REPLACE FUNCTION notify_cut.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'the replica died before announcing'; END$$;`)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", "public,notify_cut,pg_catalog")
	u.RawQuery = q.Encode()
	pool, err := postgres.Open(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return store.New(pool, opts)
}

// A replica records an action's finish and dies before announcing it; the executor,
// unanswered, delivers the event again to another replica, where it is a duplicate. A
// watcher on a third replica must still see the action finish: the redelivery announces
// the state it confirms. With announcements inside Record's transaction, the first
// replica's Record does not commit at all, and the redelivery is new.
func TestAFinishLostBeforeItsAnnouncementReachesWatchers(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts store.Options
	}{
		{"announced inside the transaction", store.Options{}},
		{"announced after commit", store.Options{NotifyAfterCommit: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pg.NewDatabase(t)
			watched, redelivered := startInstance(t, db), startInstance(t, db)
			dying := cutAnnouncements(t, db, tc.opts)
			stream, _ := openWatch(t, watched, &eventsv1.WatchActionsRequest{Project: "demo", Domain: "development", Run: "cut"})
			received := make(chan *eventsv1.Action)
			go func() {
				for stream.Receive() {
					received <- stream.Msg().GetAction()
				}
				close(received)
			}()
			waitFor := func(phase flytecorev1.ActionPhase) {
				t.Helper()
				deadline := time.After(30 * time.Second)
				for {
					select {
					case act, ok := <-received:
						if !ok {
							t.Fatalf("stream ended: %v", stream.Err())
						}
						if act.GetPhase() == phase {
							return
						}
					case <-deadline:
						t.Fatalf("the watcher never saw the action %s", phase)
					}
				}
			}

			id := actionID("cut", "a0")
			record(t, redelivered.client, event(id, 1, running, 0, 1))
			waitFor(running)

			finish := event(id, 1, succeeded, 0, 2)
			_, err := dying.Record(context.Background(), []*eventsv1.ActionEvent{finish})
			if tc.opts.NotifyAfterCommit && err != nil {
				t.Fatalf("Record with its announcement cut after commit: %v", err)
			}
			if !tc.opts.NotifyAfterCommit && err == nil {
				t.Fatal("Record whose NOTIFY failed inside its transaction succeeded; want it refused, uncommitted")
			}
			record(t, redelivered.client, finish)
			waitFor(succeeded)
		})
	}
}

// A redelivered event that is its action's latest state is announced again (and
// counted as confirmed); one the action has moved past is not.
func TestARedeliveryOfTheLatestStateIsAnnouncedAgain(t *testing.T) {
	ctx := context.Background()
	db := pg.NewDatabase(t)
	st, _ := openStore(t, db)
	listener, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(ctx) }()
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{store.NotifyChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return n.Payload
	}
	old, latest := event(actionID("again", "a0"), 1, queued, 0, 1), event(actionID("again", "a0"), 1, running, 0, 2)
	storeRecord(t, st, old, latest)
	if got := next(); got != "demo/development/again/a0" {
		t.Fatalf("first recording announced %q", got)
	}
	for _, tc := range []struct {
		name      string
		batch     []*eventsv1.ActionEvent
		confirmed int
	}{
		{"the latest state", []*eventsv1.ActionEvent{latest}, 1},
		{"an event moved past", []*eventsv1.ActionEvent{old}, 0},
		{"both", []*eventsv1.ActionEvent{old, latest}, 1},
	} {
		res := storeRecord(t, st, tc.batch...)
		if res.Recorded != 0 || res.Changed != 0 || res.Confirmed != tc.confirmed {
			t.Fatalf("redelivering %s: %+v; want nothing recorded or changed, %d confirmed", tc.name, res, tc.confirmed)
		}
	}
	// Two of the three redeliveries confirmed the state; a marker shows nothing else came.
	storeRecord(t, st, event(actionID("again", "marker"), 1, running, 0, 1))
	var got []string
	for len(got) == 0 || got[len(got)-1] != "demo/development/again/marker" {
		got = append(got, next())
	}
	if want := []string{"demo/development/again/a0", "demo/development/again/a0", "demo/development/again/marker"}; !slices.Equal(got, want) {
		t.Fatalf("redeliveries announced %q; want %q", got, want)
	}
}
