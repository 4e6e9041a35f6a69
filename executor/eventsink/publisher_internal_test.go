package eventsink

import (
	"strings"
	"testing"
	"time"

	"buf.build/go/protovalidate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// TestEventsFromTenantTextPassTheContract: Kubernetes events are written by anyone who
// may create Events in a namespace, and task messages come from user code. Text the
// contract refuses (a NUL, invalid UTF-8, too long) must be cleaned on the way out, or
// the events service refuses the action's events forever.
func TestEventsFromTenantTextPassTheContract(t *testing.T) {
	hostile := "bad\x00text \xff" + strings.Repeat("é", 70000)
	now := metav1.NewTime(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: "a1", TaskType: "container"}}
	h := flytev1.PhaseTransition{
		Phase: flytev1.PhaseFailed, Attempt: 1, OccurredAt: metav1.NewMicroTime(now.Time), Reason: hostile, Message: hostile,
		Error:    &flytev1.ExecutionError{Code: hostile, Kind: flytev1.ErrorKindUser, Message: hostile},
		LogLinks: []flytev1.LogLink{{Name: hostile, URI: "https://logs.example/" + strings.Repeat("x", 3000)}, {Name: "ok", URI: "https://logs.example/a"}},
	}
	for range 150 {
		h.ClusterEvents = append(h.ClusterEvents, flytev1.ClusterEvent{OccurredAt: now, Object: hostile, Type: hostile, Reason: hostile, Message: hostile, Count: 1})
	}
	ev := (&Publisher{cluster: "c1"}).toEvent(ta, h, nil)
	if err := protovalidate.Validate(ev); err != nil {
		t.Fatalf("the event breaks the contract: %v", err)
	}
	if !strings.HasPrefix(ev.GetMessage(), "badtext ") || len(ev.GetLogLinks()) != 1 {
		t.Fatalf("cleaning lost more than it had to: message %.20q, %d log links", ev.GetMessage(), len(ev.GetLogLinks()))
	}
}
