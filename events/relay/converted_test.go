package relay

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events/outbox"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

func entry(pos int64) outbox.Entry {
	return outbox.Entry{Position: outbox.Position{Tx: 7, Pos: pos, Ordinal: 1}, Event: &eventsv1.ActionEvent{
		Id:      &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: "r", Action: fmt.Sprintf("a%d", pos)},
		Attempt: 1, Phase: flytecorev1.ActionPhase_ACTION_PHASE_RUNNING, OccurredAt: timestamppb.New(time.Unix(1, 0)),
	}}
}

// Sinks share the conversion of an entry, and the cache keeps at most its bound, the
// newest.
func TestConvertedSharesAndStaysBounded(t *testing.T) {
	c := newConverted("test", 3)
	first, err := c.get(entry(1))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.get(entry(1))
	if err != nil || again.ID() != first.ID() || len(c.events) != 1 {
		t.Fatalf("the same entry again: %q (%v), %d cached; want %q from the cache", again.ID(), err, len(c.events), first.ID())
	}
	for pos := int64(2); pos <= 5; pos++ {
		if _, err := c.get(entry(pos)); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.events) != 3 || len(c.order) != 3 {
		t.Fatalf("%d cached (%d in order); want the bound, 3", len(c.events), len(c.order))
	}
	for _, gone := range []int64{1, 2} {
		if _, ok := c.events[entry(gone).Position]; ok {
			t.Errorf("entry %d, among the oldest, is still cached", gone)
		}
	}
	if _, ok := c.events[entry(5).Position]; !ok {
		t.Error("the newest entry is not cached")
	}
}
