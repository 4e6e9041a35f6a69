package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flytekube/backend/test/eventually"
)

// A rollout adds sink "b": replicas of the new configuration register it when they
// start, while relays of the old one, which know only "a", lead, and one of them takes
// over from another meanwhile. Once a new relay leads, "b" gets every event recorded
// since a replica first registered it: no leader dropped a cursor it did not know.
func TestAnOldLeaderKeepsTheCursorOfASinkItDoesNotKnow(t *testing.T) {
	ctx := context.Background()
	d := newDB(t)
	a, b := newReceiver(t), newReceiver(t)
	old1 := startRelay(t, d, a.sink(t, "a", ""))
	eventually.True(t, 10*time.Second, func() bool { return old1.leading(t) }, func() string { return "the old relay never led" })
	registered(t, d, "a")

	// A replica of the new configuration starts: it registers its sinks before it
	// serves (events.Run), and its relay waits for the leadership.
	if _, err := d.outbox.AddSinks(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	d.record(t, actionEvents("rollout", "before-handover")...)

	// Another old replica takes over, and relays what follows to "a".
	old1.stop()
	old2 := startRelay(t, d, a.sink(t, "a", ""))
	eventually.True(t, 10*time.Second, func() bool { return old2.leading(t) }, func() string { return "the second old relay never led" })
	d.record(t, actionEvents("rollout", "under-old-leader")...)
	eventually.True(t, 30*time.Second, func() bool { return len(a.got()) >= 2*len(lifecycle) },
		func() string {
			return fmt.Sprintf("sink a got %d of %d under the old leaders", len(a.got()), 2*len(lifecycle))
		})
	d.record(t, actionEvents("rollout", "last-under-old")...)

	// The old replicas are gone; a new one leads.
	old2.stop()
	startRelay(t, d, a.sink(t, "a", ""), b.sink(t, "b", ""))
	want := 3 * len(lifecycle)
	eventually.True(t, 30*time.Second, func() bool { return len(b.got()) >= want },
		func() string {
			return fmt.Sprintf("the new sink got %d of the %d events recorded since it was registered", len(b.got()), want)
		})
	inOrderOnce(t, b.got(), want)
}
