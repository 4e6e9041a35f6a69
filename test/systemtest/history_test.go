package systemtest

import (
	"fmt"
	"strings"
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

func TestCheckHistoryStored(t *testing.T) {
	queued := flytev1.PhaseTransition{Phase: flytev1.PhaseQueued, Attempt: 1, Version: 0}
	succeeded := flytev1.PhaseTransition{Phase: flytev1.PhaseSucceeded, Attempt: 1, Version: 1}
	event := func(h flytev1.PhaseTransition) *eventsv1.ActionEvent {
		k := KeyOfEntry(h)
		return &eventsv1.ActionEvent{Attempt: k.Attempt, Phase: k.Phase, Version: k.Version}
	}
	aborted := &eventsv1.ActionEvent{Attempt: 1, Phase: flytecorev1.ActionPhase_ACTION_PHASE_ABORTED, Version: 1}
	abortAllowed := func(k EventKey) bool { return k.Phase == flytecorev1.ActionPhase_ACTION_PHASE_ABORTED }
	tests := []struct {
		name    string
		history flytev1.PhaseHistory
		events  []*eventsv1.ActionEvent
		extra   func(EventKey) bool
		want    []string // a part of each complaint, in order
	}{
		{name: "each entry once", history: flytev1.PhaseHistory{queued, succeeded},
			events: []*eventsv1.ActionEvent{event(queued), event(succeeded)}},
		{name: "an entry missing", history: flytev1.PhaseHistory{queued, succeeded},
			events: []*eventsv1.ActionEvent{event(queued)}, want: []string{"(attempt 1, SUCCEEDED, v1) never reached"}},
		{name: "an entry twice", history: flytev1.PhaseHistory{queued},
			events: []*eventsv1.ActionEvent{event(queued), event(queued)}, want: []string{"stored 2 times"}},
		{name: "an event not in the history", history: flytev1.PhaseHistory{queued},
			events: []*eventsv1.ActionEvent{event(queued), aborted}, want: []string{"ABORTED, v1) (1 times), which is not in the action's history"}},
		{name: "an extra the caller allows", history: flytev1.PhaseHistory{queued},
			events: []*eventsv1.ActionEvent{event(queued), aborted}, extra: abortAllowed},
		{name: "an allowed extra twice", history: flytev1.PhaseHistory{queued},
			events: []*eventsv1.ActionEvent{event(queued), aborted, aborted}, extra: abortAllowed, want: []string{"holds (attempt 1, ABORTED, v1) 2 times"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			CheckHistoryStored("a", tt.history, tt.events, tt.extra, func(f string, args ...any) { got = append(got, fmt.Sprintf(f, args...)) })
			if len(got) != len(tt.want) {
				t.Fatalf("complaints %q, want %d like %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("complaint %q, want it to say %q", got[i], w)
				}
			}
		})
	}
}
