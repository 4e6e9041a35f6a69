package store_test

import (
	"testing"

	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

func TestPhaseRules(t *testing.T) {
	const newer = flytecorev1.ActionPhase(99) // a phase of a newer release
	tests := []struct {
		phase    flytecorev1.ActionPhase
		terminal bool
		named    bool
		rank     int16
	}{
		{flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED, false, false, -1},
		{flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, false, true, 1},
		{flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES, false, true, 2},
		{flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING, false, true, 3},
		{flytecorev1.ActionPhase_ACTION_PHASE_RUNNING, false, true, 4},
		{flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED, true, true, 5},
		{flytecorev1.ActionPhase_ACTION_PHASE_FAILED, true, true, 5},
		{flytecorev1.ActionPhase_ACTION_PHASE_ABORTED, true, true, 5},
		{flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT, true, true, 5},
		{newer, false, false, -1},
	}
	for _, tt := range tests {
		t.Run(tt.phase.String(), func(t *testing.T) {
			if got := store.IsTerminal(tt.phase); got != tt.terminal {
				t.Errorf("IsTerminal = %v; want %v", got, tt.terminal)
			}
			if got := store.IsNamed(tt.phase); got != tt.named {
				t.Errorf("IsNamed = %v; want %v", got, tt.named)
			}
			if got := store.Rank(tt.phase); got != tt.rank {
				t.Errorf("Rank = %d; want %d", got, tt.rank)
			}
		})
	}
	if len(tests)-2 != len(flytecorev1.ActionPhase_name)-1 {
		t.Errorf("the table has %d named phases; the contract names %d", len(tests)-2, len(flytecorev1.ActionPhase_name)-1)
	}
}
