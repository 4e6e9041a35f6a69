package sandbox

import (
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

// Every phase an action can be in has the contract's name contractPhase derives.
func TestContractPhase(t *testing.T) {
	for _, p := range []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseWaitingForResources, flytev1.PhaseInitializing,
		flytev1.PhaseRunning, flytev1.PhaseSucceeded, flytev1.PhaseFailed, flytev1.PhaseAborted, flytev1.PhaseTimedOut} {
		name := contractPhase(p)
		if v, ok := flytecorev1.ActionPhase_value[name]; !ok || v == 0 {
			t.Errorf("%s: %s is not a phase of the contract", p, name)
		}
	}
}
