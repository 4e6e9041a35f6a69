package eventsink

import (
	"testing"

	"github.com/flytekube/backend/events/store"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

func TestProtoPhase(t *testing.T) {
	tests := []struct {
		phase flytev1.Phase
		want  flytecorev1.ActionPhase
	}{
		{flytev1.PhaseQueued, flytecorev1.ActionPhase_ACTION_PHASE_QUEUED},
		{flytev1.PhaseWaitingForResources, flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES},
		{flytev1.PhaseInitializing, flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING},
		{flytev1.PhaseRunning, flytecorev1.ActionPhase_ACTION_PHASE_RUNNING},
		{flytev1.PhaseSucceeded, flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED},
		{flytev1.PhaseFailed, flytecorev1.ActionPhase_ACTION_PHASE_FAILED},
		{flytev1.PhaseAborted, flytecorev1.ActionPhase_ACTION_PHASE_ABORTED},
		{flytev1.PhaseTimedOut, flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT},
		{"", flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED},
		{"Sleeping", flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED},
	}
	for _, tt := range tests {
		t.Run(string(tt.phase), func(t *testing.T) {
			if got := ProtoPhase(tt.phase); got != tt.want {
				t.Errorf("ProtoPhase(%q) = %s; want %s", tt.phase, got, tt.want)
			}
		})
	}
}

// TestProtoPhaseCoversEveryPhase: every phase of the CRD has a phase of the contract of
// its own, and the two sides' rules agree on which end an action.
func TestProtoPhaseCoversEveryPhase(t *testing.T) {
	seen := map[flytecorev1.ActionPhase]flytev1.Phase{}
	for _, p := range flytev1.Phases() {
		c := ProtoPhase(p)
		if !store.IsNamed(c) {
			t.Errorf("ProtoPhase(%s) = %s; want a phase the contract names", p, c)
		}
		if other, ok := seen[c]; ok {
			t.Errorf("ProtoPhase(%s) = ProtoPhase(%s) = %s", p, other, c)
		}
		seen[c] = p
		if p.IsTerminal() != store.IsTerminal(c) {
			t.Errorf("%s.IsTerminal() = %v, but store.IsTerminal(%s) = %v", p, p.IsTerminal(), c, store.IsTerminal(c))
		}
	}
	if len(phases) != len(flytev1.Phases()) {
		t.Errorf("the map has %d entries; the CRD has %d phases", len(phases), len(flytev1.Phases()))
	}
}
