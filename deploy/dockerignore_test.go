package deploy_test

// The .dockerignore, checked against what the builds compile and what git ignores.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	_ "github.com/flytekube/backend/gen/go/flyte/cache/v1"  // the descriptors of the RPCs runCompose calls
	_ "github.com/flytekube/backend/gen/go/flyte/events/v1" // the descriptors of the RPCs runCompose calls
)

// checkDockerignore requires the build context to hold everything the builds compile
// and nothing git ignores (build outputs, test binaries) or keeps (.git).
func checkDockerignore(t *testing.T, root string, images map[string]*image) {
	rules := dockerignore(t, filepath.Join(root, ".dockerignore"))
	for _, p := range []string{".git", ".git/config"} {
		if !ignored(rules, p) {
			t.Errorf(".dockerignore sends %s", p)
		}
	}
	needed := map[string]string{"go.mod": "the build", "go.sum": "the build"}
	for _, img := range images {
		for _, b := range img.builds {
			cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-json=Dir,GoFiles,EmbedFiles,Module", b.pkg)
			cmd.Dir = root
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list %s: %v", b.pkg, err)
			}
			dec := json.NewDecoder(bytes.NewReader(out))
			for dec.More() {
				var p struct {
					Dir                 string
					GoFiles, EmbedFiles []string
					Module              *struct{ Main bool }
				}
				if err := dec.Decode(&p); err != nil {
					t.Fatal(err)
				}
				if p.Module == nil || !p.Module.Main {
					continue
				}
				for _, f := range slices.Concat(p.GoFiles, p.EmbedFiles) {
					rel, err := filepath.Rel(root, filepath.Join(p.Dir, f))
					if err != nil {
						t.Fatal(err)
					}
					needed[filepath.ToSlash(rel)] = b.pkg
				}
			}
		}
	}
	for _, f := range slices.Sorted(maps.Keys(needed)) {
		if ignored(rules, f) {
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
		if p = strings.TrimSuffix(p, "/"); !ignored(rules, p) {
			t.Errorf(".dockerignore sends %s, which git ignores", p)
		}
	}
}

type ignoreRule struct {
	re      *regexp.Regexp
	exclude bool // false for "!" exceptions
}

// dockerignore compiles .dockerignore as Docker does: patterns relative to the context
// root, * and ? within a path element, ** across them, later rules winning.
func dockerignore(t *testing.T, file string) []ignoreRule {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rules []ignoreRule
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{exclude: true}
		if rest, ok := strings.CutPrefix(line, "!"); ok {
			line, r.exclude = strings.TrimSpace(rest), false
		}
		line = strings.TrimPrefix(path.Clean(line), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch ch := line[i]; {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(".*")
				i++
			case ch == '*':
				re.WriteString("[^/]*")
			case ch == '?':
				re.WriteString("[^/]")
			case ch == '[':
				j := strings.IndexByte(line[i:], ']')
				if j < 0 {
					t.Fatalf(".dockerignore: %q: unterminated [", line)
				}
				re.WriteString(line[i : i+j+1])
				i += j
			default:
				re.WriteString(regexp.QuoteMeta(string(ch)))
			}
		}
		re.WriteString("$")
		r.re = regexp.MustCompile(re.String())
		rules = append(rules, r)
	}
	return rules
}

// ignored reports whether the context leaves p out: the last rule matching p or one of
// its parent directories decides.
func ignored(rules []ignoreRule, p string) bool {
	var candidates []string
	for q := p; q != "." && q != "/"; q = path.Dir(q) {
		candidates = append(candidates, q)
	}
	out := false
	for _, r := range rules {
		if slices.ContainsFunc(candidates, r.re.MatchString) {
			out = r.exclude
		}
	}
	return out
}
