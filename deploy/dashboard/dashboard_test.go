package dashboard_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/flytekube/backend/deploy/dashboard"
	"github.com/flytekube/backend/test/repo"
)

// TestCommittedDashboardIsCurrent: the dashboard.json the monitoring component ships is
// what the code renders (`make dashboard-generate` writes it).
func TestCommittedDashboardIsCurrent(t *testing.T) {
	path, err := repo.Path("deploy", "kustomize", "components", "monitoring", "dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := dashboard.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, rendered) {
		t.Fatal("deploy/kustomize/components/monitoring/dashboard.json is not what deploy/dashboard renders: run make dashboard-generate")
	}
}
