package events_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/events/store"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// Record announces changed actions after its transaction commits, and concurrent
// Records share notifications: a NOTIFY inside each Record's transaction would hold
// Postgres's notification lock through every commit, one after another. Every change is
// still announced.
func TestConcurrentRecordsShareNotifications(t *testing.T) {
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
