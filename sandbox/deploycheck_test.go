package sandbox

import (
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

// Every phase an action can be in has the contract's name contractPhase derives.
func TestContractPhase(t *testing.T) {
	for _, p := range flytev1.Phases() {
		name := contractPhase(p)
		if v, ok := flytecorev1.ActionPhase_value[name]; !ok || v == 0 {
			t.Errorf("%s: %s is not a phase of the contract", p, name)
		}
	}
}
