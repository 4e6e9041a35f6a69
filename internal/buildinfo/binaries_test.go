package buildinfo_test

// The programs as `make build` stamps them, and as a plain `go build` leaves them: each
// says what it is for --version, without any configuration.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/test/repo"
)

var programs = []string{"executor", "events", "cacheservice"}

// versionOf runs bin --version with nothing else: no flags, no configuration, no cluster.
func versionOf(t *testing.T, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "--version")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "KUBECONFIG=/nonexistent"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	return string(out)
}

func git(t *testing.T, root string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

func TestMakeBuildStampsTheVersion(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	const version, commit = "v9.8.7-test", "0123456789abcdef0123456789abcdef01234567"
	make := exec.Command("make", "-s", "--no-print-directory", "build-programs", "BIN="+bin, "VERSION="+version, "COMMIT="+commit)
	make.Dir = root
	if out, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make build-programs: %v\n%s", err, out)
	}
	for _, p := range programs {
		t.Run(p, func(t *testing.T) {
			got := versionOf(t, filepath.Join(bin, p))
			want := p + " " + version + " (commit " + commit + ", " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
			if got != want {
				t.Errorf("--version printed %q; want %q", got, want)
			}
		})
	}
}

// TestAPlainBuildNamesItsCommit: without -ldflags, the toolchain's stamp names the commit
// (go build's default, -buildvcs=auto; a GOFLAGS=-buildvcs=false of the machine is
// overridden, so that the test sees what a plain build elsewhere does). In a linked git
// worktree, whose .git is a file, the toolchain stamps nothing (golang/go#58218): there
// the binary must say "unknown" rather than name a wrong commit; `make build` names it.
func TestAPlainBuildNamesItsCommit(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "events")
	build := exec.Command("go", "build", "-o", bin, "./events/cmd/events")
	build.Dir = root
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=auto")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	got := versionOf(t, bin)
	want := "(commit " + git(t, root, "rev-parse", "HEAD")
	if info, err := os.Stat(filepath.Join(root, ".git")); err == nil && !info.IsDir() {
		want = "(commit unknown,"
	}
	if !strings.HasPrefix(got, "events ") || !strings.Contains(got, want) {
		t.Errorf("--version printed %q; want it to hold %q", got, want)
	}
}

// TestDescribeAgreesWithMake: the version the Go builders (make deploy-node) stamp is the
// one make stamps.
func TestDescribeAgreesWithMake(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("make", "-s", "--no-print-directory", "-C", root, "version").Output()
	if err != nil {
		t.Fatalf("make version: %v", err)
	}
	version, commit := buildinfo.Describe(context.Background(), root)
	if want := strings.TrimSpace(string(out)); version != want {
		t.Errorf("Describe's version %q; make version says %q", version, want)
	}
	if head := git(t, root, "rev-parse", "HEAD"); commit != head {
		t.Errorf("Describe's commit %q; HEAD is %s", commit, head)
	}
	if v, c := buildinfo.Describe(context.Background(), t.TempDir()); v != buildinfo.Devel || c != buildinfo.Unknown {
		t.Errorf("outside git: %q and %q; want %q and %q", v, c, buildinfo.Devel, buildinfo.Unknown)
	}
}
