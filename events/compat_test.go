package events_test

import (
	"bytes"
	"context"
	"math"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// A phase, a cache status and an error kind this release does not name, as a newer
// executor would send them.
const (
	newerPhase       = flytecorev1.ActionPhase(9)
	newerCacheStatus = flytecorev1.CacheStatus(7)
	newerErrorKind   = flytecorev1.ExecutionError_Kind(3)
)

// withNewerField appends a field numbered 50 (which no message of the contract uses) to
// m, as a newer schema's field would arrive.
func withNewerField(m proto.Message, value string) {
	r := m.ProtoReflect()
	b := protowire.AppendTag(r.GetUnknown(), 50, protowire.BytesType)
	r.SetUnknown(protowire.AppendString(b, value))
}

// newerEvent is an event as a newer executor sends it: fields and enum values this
// release's schema does not name, in the event and in the messages it holds.
func newerEvent(id *flytecorev1.ActionIdentifier, phase flytecorev1.ActionPhase, at int) *eventsv1.ActionEvent {
	e := event(id, 1, phase, 0, at)
	e.CacheStatus = newerCacheStatus
	e.Error = &flytecorev1.ExecutionError{Code: "Preempted", Kind: newerErrorKind, Message: "the node was reclaimed"}
	e.ClusterEvents = []*eventsv1.ClusterEvent{{OccurredAt: e.GetOccurredAt(), Object: "Pod/p", Type: "Warning", Reason: "Preempting"}}
	e.LogLinks = []*eventsv1.LogLink{{Name: "Kubernetes", Uri: "https://logs.example.com/p"}}
	for _, m := range []proto.Message{e, e.GetId(), e.GetError(), e.GetClusterEvents()[0], e.GetLogLinks()[0], e.GetOccurredAt()} {
		withNewerField(m, "from a newer release")
	}
	return e
}

// TestNewerClientsEventsAreStoredAsSent: an event of a newer executor, with fields and
// enum values this release does not know, is accepted through the generated client over
// HTTP/2, stored with its bytes as the client encoded them, and listed back
// byte-identical, so that nothing a newer release sent is lost when the service is
// rolled back or older than its executor.
func TestNewerClientsEventsAreStoredAsSent(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	_, pool := openStore(t, db)
	for _, tc := range []struct {
		name  string
		phase flytecorev1.ActionPhase
	}{
		{"a known phase", running},
		{"a phase this release does not name", newerPhase},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := actionID("newer", "a"+string(rune('0'+tc.phase)))
			e := newerEvent(id, tc.phase, 1)
			sent, err := proto.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			if res := record(t, inst.client, e); res.GetRecorded() != 1 {
				t.Fatalf("recorded %d events; want 1", res.GetRecorded())
			}
			var stored []byte
			if err := pool.QueryRow(context.Background(), `SELECT event FROM action_events WHERE action = $1`, id.GetAction()).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(stored, sent) {
				t.Errorf("stored %d bytes; want the %d the client sent, as sent", len(stored), len(sent))
			}
			listed := listAllEvents(t, inst.client, id, 0, 2, nil)
			if len(listed) != 1 {
				t.Fatalf("listed %d events; want 1", len(listed))
			}
			served, err := proto.Marshal(listed[0])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(served, sent) {
				t.Errorf("served %d bytes; want the %d the client sent, as sent", len(served), len(sent))
			}
			got := getAction(t, inst.client, id)
			if got.GetPhase() != tc.phase || got.GetCacheStatus() != newerCacheStatus || got.GetError().GetKind() != newerErrorKind {
				t.Errorf("action is %s, cache %d, error kind %d; want phase %d, cache %d, kind %d",
					stateString(got), got.GetCacheStatus(), got.GetError().GetKind(), tc.phase, newerCacheStatus, newerErrorKind)
			}
			listedActions, err := inst.client.ListActions(context.Background(), connect.NewRequest(&eventsv1.ListActionsRequest{
				Project: id.GetProject(), Domain: id.GetDomain(), Run: id.GetRun(), Phase: tc.phase,
			}))
			if err != nil {
				t.Fatalf("ListActions by phase %d: %v", tc.phase, err)
			}
			if n := len(listedActions.Msg.GetActions()); n != 1 {
				t.Errorf("listing phase %d found %d actions; want 1", tc.phase, n)
			}
		})
	}
}

// TestWhatStaysRefused: accepting what a newer client sends leaves every other rule as
// strict: no phase is not a phase, a phase the store's column cannot hold is refused
// rather than stored as another, and the bound on an event's size counts the fields this
// release does not know.
func TestWhatStaysRefused(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	requireRefused(t, inst.client, func() *eventsv1.ActionEvent { return newerEvent(actionID("r1", "a0"), newerPhase, 1) }, []refusal{
		{"the unspecified phase", func(e *eventsv1.ActionEvent) { e.Phase = 0 }, "events[0].phase"},
		{"a phase past the column", func(e *eventsv1.ActionEvent) { e.Phase = math.MaxInt16 + 1 }, "events[0].phase"},
		{"a negative phase", func(e *eventsv1.ActionEvent) { e.Phase = -1 }, "events[0].phase"},
		{"unknown fields past the event's bound", func(e *eventsv1.ActionEvent) { withUnknownField(e, store.MaxEventBytes) }, "events[0]"},
		{"a bad string beside a newer field", func(e *eventsv1.ActionEvent) { e.Reason = "a\x00b" }, "events[0].reason"},
	})
	requireNothingStored(t, db)
}

// TestAPhaseThisReleaseDoesNotNameRanksBelowEveryKnownPhase: an old replica cannot know
// where a newer phase stands in an attempt's progress, nor whether it ends the action.
// It ranks below every phase the replica knows, within its attempt: stored and listed,
// it is an action's latest state only while nothing known of that attempt (or a later
// one) is stored, and it never replaces a known phase of its attempt, so the order the
// replica serves among the phases it knows is the one it always served.
func TestAPhaseThisReleaseDoesNotNameRanksBelowEveryKnownPhase(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	tests := []struct {
		name    string
		batches [][]*eventsv1.ActionEvent
		want    flytecorev1.ActionPhase
		attempt uint32
	}{
		{"alone, it is the state", [][]*eventsv1.ActionEvent{{ev(1, newerPhase, 0, 1)}}, newerPhase, 1},
		{"it does not replace a known phase", [][]*eventsv1.ActionEvent{{ev(1, running, 0, 1)}, {ev(1, newerPhase, 0, 2)}}, running, 1},
		{"a known phase replaces it", [][]*eventsv1.ActionEvent{{ev(1, newerPhase, 0, 1)}, {ev(1, queued, 0, 2)}}, queued, 1},
		{"a terminal phase stays", [][]*eventsv1.ActionEvent{{ev(1, succeeded, 0, 1)}, {ev(1, newerPhase, 0, 2)}}, succeeded, 1},
		{"in one batch", [][]*eventsv1.ActionEvent{{ev(1, newerPhase, 0, 3), ev(1, running, 0, 1)}}, running, 1},
		{"a later attempt's is newer", [][]*eventsv1.ActionEvent{{ev(1, failed, 0, 1)}, {ev(2, newerPhase, 0, 2)}}, newerPhase, 2},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := actionID("rank", "a"+string(rune('a'+i)))
			for _, b := range tc.batches {
				for _, e := range b {
					e.Id = id
				}
				record(t, inst.client, b...)
			}
			if got := getAction(t, inst.client, id); got.GetPhase() != tc.want || got.GetAttempt() != tc.attempt {
				t.Fatalf("action is %s; want attempt %d phase %d", stateString(got), tc.attempt, tc.want)
			}
			var n int
			for _, b := range tc.batches {
				n += len(b)
			}
			if listed := listAllEvents(t, inst.client, id, 0, 2, nil); len(listed) != n {
				t.Fatalf("listed %d events; want all %d", len(listed), n)
			}
		})
	}
	if r := store.Rank(newerPhase); r >= store.Rank(flytecorev1.ActionPhase_ACTION_PHASE_QUEUED) {
		t.Errorf("Rank(%d) = %d; want below every known phase's", newerPhase, r)
	}
}
