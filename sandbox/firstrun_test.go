package sandbox

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flytekube/backend/test/repo"
)

// TestProgressSaysWhatAScriptBuilds runs hack/progress.sh's long and quietly as the
// first-run scripts do: a step says what it builds and how long that takes the first
// time, a line while a slow one runs and its time once done; a step's own output (go's
// "downloading" lines) stays out of the terminal unless it fails; a failure is the step's.
func TestProgressSaysWhatAScriptBuilds(t *testing.T) {
	progress, err := repo.Path("hack", "progress.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, script string
		fails        bool
		want, none   []string
	}{
		{
			name:   "quick",
			script: `long "building x" "about 3 min" true`,
			want:   []string{"test: building x (about 3 min the first time)"},
			none:   []string{"still", "done in"},
		},
		{
			// The step runs until its heartbeat is in the terminal.
			name:   "slow",
			script: `PROGRESS_EVERY=1 long "building x" "about 3 min" bash -c 'until grep -q still "$TERMINAL"; do sleep 0.05; done'`,
			want:   []string{"test: building x (about 3 min the first time)", "test:   still building x: ", "test:   building x: done in "},
		},
		{
			name:   "quiet",
			script: `long "downloading x's modules" "under a minute" quietly "$DIR/tidy.log" bash -c 'echo "go: downloading example.com/x v1.0.0" >&2'`,
			want:   []string{"downloading x's modules"},
			none:   []string{"go: downloading"},
		},
		{
			name:   "failed",
			script: `long "building x" "about 3 min" quietly "$DIR/build.log" bash -c 'echo "go: downloading example.com/x v1.0.0"; echo "x.go:1: syntax error" >&2; exit 3'`,
			fails:  true,
			want:   []string{"failed (3); the end of its output:", "x.go:1: syntax error"},
			none:   []string{"done in"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			terminal := filepath.Join(dir, "terminal")
			cmd := exec.Command("bash", "-c", "set -euo pipefail\nprogress_name=test\nsource \"$PROGRESS\"\n"+tc.script+" 2>>\"$TERMINAL\"")
			cmd.Env = append(os.Environ(), "PROGRESS="+progress, "TERMINAL="+terminal, "DIR="+dir)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			if (err != nil) != tc.fails {
				t.Fatalf("the script: %v, want failed %v\n%s", err, tc.fails, out.String())
			}
			raw, _ := os.ReadFile(terminal)
			checkSaid(t, string(raw)+out.String(), tc.want, tc.none)
		})
	}
}

// TestEveryFirstRunBuildSaysSo holds the scripts a first `make run` runs to their word:
// every go build, go mod tidy and apt-get install in them runs under long, so none leaves
// the terminal silent for minutes (a first make run once printed nothing but "building the
// binaries" for ten of them).
func TestEveryFirstRunBuildSaysSo(t *testing.T) {
	long := regexp.MustCompile(`\b(go build|go mod tidy|apt-get install)\b`)
	for _, script := range []string{"envtest.sh", "node.sh", "jaeger.sh"} {
		path, err := repo.Path("hack", script)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		for i, line := range lines {
			code := strings.TrimSpace(line)
			if strings.HasPrefix(code, "#") || !long.MatchString(code) {
				continue
			}
			// The command is long's last argument: on its line or one it continues.
			wrapped := false
			for j := i; j >= 0 && j > i-4; j-- {
				if strings.Contains(lines[j], "long ") {
					wrapped = true
					break
				}
				if prev := strings.TrimSpace(lines[j]); j < i && !strings.HasSuffix(prev, `\`) && !strings.HasSuffix(prev, "||") && !strings.HasSuffix(prev, "&&") {
					break
				}
			}
			// The pause program is built in a second or two, with the images.
			if !wrapped && !strings.Contains(code, "./hack/pause") {
				t.Errorf("hack/%s:%d runs %q outside long: a first run would sit silent through it", script, i+1, long.FindString(code))
			}
		}
	}
}
