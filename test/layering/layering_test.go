package layering_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/flytekube/backend/test/repo"
)

const module = "github.com/flytekube/backend/"

// The layers, top to bottom: the harnesses of tests and benchmarks (test/, bench/, e2e/)
// and the tools of a developer (sandbox/, hack/) may use anything; the programs' packages
// (executor/, events/, cacheservice/, services/, deploy/) use only each other and
// internal/; internal/ holds the libraries under all of them and uses nothing of the
// project above it. Test files may reach up, since they are harnesses too.
var (
	harnesses = []string{module + "test/", module + "bench/", module + "e2e/", module + "sandbox/", module + "hack/"}
	products  = []string{module + "executor/", module + "events/", module + "cacheservice/", module + "services/", module + "deploy/"}
)

// TestLayers lists each package's dependencies, direct or not (test files aside), and
// fails on one its layer must not have.
func TestLayers(t *testing.T) {
	tests := []struct {
		pkg, why  string
		forbidden []string // import path prefixes
	}{
		{pkg: "./services/postgres", why: "the database package speaks in its own terms; the RPC edge (services/server) turns them into codes",
			forbidden: []string{"connectrpc.com/", "google.golang.org/grpc"}},
		{pkg: "./events/relay", why: "the relay is a part the events service runs, not a service: it needs nothing of the service runner",
			forbidden: []string{module + "services/app"}},
		{pkg: "./internal/...", why: "internal/ holds the libraries under the programs: nothing of the project above it",
			forbidden: append(append([]string{}, harnesses...), products...)},
	}
	for _, root := range []string{"./executor/...", "./events/...", "./cacheservice/...", "./services/...", "./deploy/..."} {
		tests = append(tests, struct {
			pkg, why  string
			forbidden []string
		}{pkg: root, why: "a program's code does not link a test or bench harness or a developer's tool", forbidden: harnesses})
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			for _, dep := range deps(t, tt.pkg) {
				for _, f := range tt.forbidden {
					if strings.HasPrefix(dep, f) {
						t.Errorf("%s depends on %s: %s", tt.pkg, dep, tt.why)
					}
				}
			}
		})
	}
}

// TestTheRuleSeesAHarness makes sure TestLayers can fail: a package known to depend on
// a harness is reported by the same listing.
func TestTheRuleSeesAHarness(t *testing.T) {
	for _, dep := range deps(t, "./e2e/chaos") {
		if strings.HasPrefix(dep, module+"test/") {
			return
		}
	}
	t.Fatal("go list -deps ./e2e/chaos names no package under test/: the listing TestLayers reads sees nothing")
}

// deps lists the packages pattern's packages depend on, direct or not, test files aside.
func deps(t *testing.T, pattern string) []string {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", pattern)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pattern, err)
	}
	return strings.Fields(string(out))
}
