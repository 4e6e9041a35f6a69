package v1_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/test/crdcompat"
	"github.com/flytekube/backend/test/repo"
)

// crdPath is where `make generate` writes the CRD, now and in every release so far.
const crdPath = "deploy/crd/flyte.org_taskactions.yaml"

// narrowingsFile lists the narrowings allowed since the previous release, each with why.
const narrowingsFile = "crd-narrowings.yaml"

// TestCRDNarrowsNothingSinceThePreviousRelease holds the CRD to the previous release's
// (RELEASES' last line, read from git): within a version a release may add fields and
// loosen rules, nothing else, because the API server applies the new schema to every
// later write of the objects already stored (test/crdcompat says what narrows). A
// narrowing that must be made goes in crd-narrowings.yaml with its reason and what it
// does to stored objects; one listed there that is no longer found fails too, so the file
// says exactly what the next release narrows.
func TestCRDNarrowsNothingSinceThePreviousRelease(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	version, commit := previousRelease(t)
	old := crdAt(t, root, commit)
	var current apiextensionsv1.CustomResourceDefinition
	if err := repo.ReadYAML(&current, crdPath); err != nil {
		t.Fatal(err)
	}
	var allowed struct {
		Since      string                `json:"since"`
		Narrowings []crdcompat.Exception `json:"narrowings"`
	}
	if err := repo.ReadYAML(&allowed, "executor", "api", "v1", narrowingsFile); err != nil {
		t.Fatal(err)
	}
	if err := crdcompat.Validate(allowed.Narrowings); err != nil {
		t.Fatalf("%s: %v", narrowingsFile, err)
	}
	if len(allowed.Narrowings) > 0 && allowed.Since != version {
		t.Fatalf("%s lists narrowings since %s, but the previous release is %s: review them against it (most are gone) and set since", narrowingsFile, allowed.Since, version)
	}
	unexcused, stale := crdcompat.Excuse(crdcompat.Compare(old, &current), allowed.Narrowings)
	for _, f := range unexcused {
		t.Errorf("the CRD narrows %s's (%s): %s", version, commit[:12], f)
	}
	if len(unexcused) > 0 {
		t.Errorf("objects stored under %s's schema may be refused on their next write (status writes and finalizer removal included). "+
			"Add a field or loosen a rule instead; or, if it must be, list each in executor/api/v1/%s with its reason and what it does to stored objects (docs/crd-versions.md)",
			version, narrowingsFile)
	}
	for _, e := range stale {
		t.Errorf("%s allows %s: %s (%q), which the CRD no longer narrows against %s: remove it", narrowingsFile, e.Path, e.Change, e.Value, version)
	}
}

// previousRelease is RELEASES' last line: the version and its commit.
func previousRelease(t *testing.T) (version, commit string) {
	t.Helper()
	raw, err := repo.ReadFile("RELEASES")
	if err != nil {
		t.Fatal(err)
	}
	s := bufio.NewScanner(bytes.NewReader(raw))
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if fields := strings.Fields(line); len(fields) >= 2 {
			version, commit = fields[0], fields[1]
		}
	}
	if commit == "" {
		t.Fatal("RELEASES names no release")
	}
	return version, commit
}

// crdAt is the CRD as commit had it. The commit must be in the clone: a shallow clone
// fails here, by name, rather than skipping the check.
func crdAt(t *testing.T, root, commit string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Fatalf("the previous release's commit %s (RELEASES) is not in this clone (%v): a shallow clone needs `git fetch --unshallow`", commit, err)
	}
	out, err := exec.Command("git", "-C", root, "show", commit+":"+crdPath).Output()
	if err != nil {
		t.Fatalf("git show %s:%s: %v (if the CRD moved, teach crdPath its old place)", commit, crdPath, err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(out, &crd); err != nil {
		t.Fatalf("%s at %s: %v", crdPath, commit, err)
	}
	return &crd
}
