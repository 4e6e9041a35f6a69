package deploy_test

// The .dockerignore, checked against what the builds compile and what git ignores.

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// checkDockerignore requires the build context to hold everything the builds compile
// and nothing git ignores (build outputs, test binaries) or keeps (.git).
func checkDockerignore(t *testing.T, root string, bins map[string]*goBinary) {
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	rules, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	ignored := func(p string) bool {
		out, err := rules.MatchesOrParentMatches(p)
		if err != nil {
			t.Fatalf(".dockerignore: %s: %v", p, err)
		}
		return out
	}
	for _, p := range []string{".git", ".git/config"} {
		if !ignored(p) {
			t.Errorf(".dockerignore sends %s", p)
		}
	}
	needed := map[string]string{"go.mod": "the build", "go.sum": "the build"}
	for _, b := range bins {
		for _, f := range b.moduleFiles {
			needed[f] = b.pkg
		}
	}
	for _, f := range slices.Sorted(maps.Keys(needed)) {
		if ignored(f) {
			t.Errorf(".dockerignore leaves out %s, which %s needs", f, needed[f])
		}
	}
	// What git ignores in this working tree: build outputs, test binaries.
	cmd := exec.CommandContext(t.Context(), "git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Logf("not checking what git ignores: git ls-files: %v", err)
		return
	}
	for p := range strings.FieldsSeq(string(out)) {
		if p = strings.TrimSuffix(p, "/"); !ignored(p) {
			t.Errorf(".dockerignore sends %s, which git ignores", p)
		}
	}
}
