package relay_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The relay is a part the events service runs, not a service: it takes its schedule from
// internal/periodic, and depends on nothing of the service runner (services/app), which
// brings the server, auth, telemetry and the database's opening with it.
func TestRelayDoesNotDependOnTheServiceRunner(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the package's dependencies with")
	}
	out, err := exec.Command(goCmd, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if dep == "github.com/flytekube/backend/services/app" {
			t.Errorf("events/relay depends on %s", dep)
		}
	}
}
