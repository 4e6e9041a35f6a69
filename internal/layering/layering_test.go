package layering_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/flytekube/backend/internal/repo"
)

// TestLayers lists each package's dependencies, direct or not, and fails on one its
// layer must not have.
func TestLayers(t *testing.T) {
	tests := []struct {
		pkg, why  string
		forbidden []string // import path prefixes
	}{
		{pkg: "./services/postgres", why: "the database package speaks in its own terms; the RPC edge (services/server) turns them into codes",
			forbidden: []string{"connectrpc.com/", "google.golang.org/grpc"}},
		{pkg: "./events/relay", why: "the relay is a part the events service runs, not a service: it needs nothing of the service runner",
			forbidden: []string{"github.com/flytekube/backend/services/app"}},
	}
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			cmd := exec.Command("go", "list", "-deps", tt.pkg)
			cmd.Dir = root
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", tt.pkg, err)
			}
			for dep := range strings.FieldsSeq(string(out)) {
				for _, f := range tt.forbidden {
					if strings.HasPrefix(dep, f) {
						t.Errorf("%s depends on %s: %s", tt.pkg, dep, tt.why)
					}
				}
			}
		})
	}
}
