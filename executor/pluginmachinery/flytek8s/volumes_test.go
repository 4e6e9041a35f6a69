package flytek8s_test

import (
	"strings"
	"testing"

	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
	"github.com/flytekube/backend/executor/tasksecrets"
)

// An action's inline pod template may not name a volume that begins with
// podtemplate.ReservedPrefix: every volume the executor adds to a task's pod must, or a
// fragment could mount it again (the staged inputs, writable) or define one of its name.
func TestTheExecutorsVolumesAreReserved(t *testing.T) {
	for _, name := range []string{flytek8s.InputsVolume, flytek8s.OutputsVolume, tasksecrets.VolumeName(0), tasksecrets.VolumeName(99)} {
		if !strings.HasPrefix(name, podtemplate.ReservedPrefix) {
			t.Errorf("the executor's volume %q does not begin with %q, which inline pod templates may not use", name, podtemplate.ReservedPrefix)
		}
	}
}
