// Package release finds the project's releases (the RELEASES file at the repository
// root) and builds the programs of one from its commit, for the upgrade test and the
// migration benchmark, which run a previous release beside the tree.
package release

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A Release is one line of RELEASES.
type Release struct {
	Version string // v0.1.0
	Commit  string // the full commit it was cut from
	Date    string // 2026-12-01
}

// Programs are the release's binaries, by the name `go build` gives them, and the
// package each is built from.
var Programs = map[string]string{
	"executor":     "./executor/cmd/executor",
	"events":       "./events/cmd/events",
	"cacheservice": "./cacheservice/cmd/cacheservice",
}

// Parse reads RELEASES: one release a line (version, commit, date, separated by
// whitespace), oldest first; # starts a comment.
func Parse(data []byte) ([]Release, error) {
	var out []Release
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("release: RELEASES line %d: want version, commit and date, got %d fields", n, len(fields))
		}
		r := Release{Version: fields[0], Commit: fields[1], Date: fields[2]}
		if !strings.HasPrefix(r.Version, "v") || len(r.Commit) != 40 {
			return nil, fmt.Errorf("release: RELEASES line %d: %q is not a version and a full commit", n, line)
		}
		if _, err := time.Parse(time.DateOnly, r.Date); err != nil {
			return nil, fmt.Errorf("release: RELEASES line %d: date: %w", n, err)
		}
		if seen[r.Version] {
			return nil, fmt.Errorf("release: RELEASES line %d: %s listed twice", n, r.Version)
		}
		seen[r.Version] = true
		out = append(out, r)
	}
	return out, sc.Err()
}

// Load reads the RELEASES file of the repository at root.
func Load(root string) ([]Release, error) {
	data, err := os.ReadFile(filepath.Join(root, "RELEASES"))
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	return Parse(data)
}

// Find returns the release named version: the oldest when version is "first", the
// latest when it is "" or "latest".
func Find(root, version string) (Release, error) {
	all, err := Load(root)
	if err != nil {
		return Release{}, err
	}
	if len(all) == 0 {
		return Release{}, errors.New("release: RELEASES lists no release")
	}
	switch version {
	case "first":
		return all[0], nil
	case "", "latest":
		return all[len(all)-1], nil
	}
	for _, r := range all {
		if r.Version == version {
			return r, nil
		}
	}
	return Release{}, fmt.Errorf("release: %s is not in RELEASES", version)
}

// NewestMigration is the version of the newest migration (a file named NNNNN_….sql) in
// dir, a directory of the repository at root such as events/store/migrations, at the
// release's commit: 0 when it has none there.
func (r Release) NewestMigration(root, dir string) (int64, error) {
	out, err := exec.Command("git", "-C", root, "ls-tree", "--name-only", r.Commit, dir+"/").Output()
	if err != nil {
		return 0, fmt.Errorf("release: listing %s at %s (a shallow clone lacks it: fetch the full history): %w", dir, r.Version, err)
	}
	var newest int64
	for _, name := range strings.Fields(string(out)) {
		name = filepath.Base(name)
		if !strings.HasSuffix(name, ".sql") {
			continue
		}
		digits, _, _ := strings.Cut(name, "_")
		v, err := strconv.ParseInt(digits, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("release: %s at %s: migration %s is not numbered", dir, r.Version, name)
		}
		newest = max(newest, v)
	}
	return newest, nil
}

// A Build is a release's source tree and binaries, kept in a cache directory.
type Build struct {
	Release
	// Source is the release's tree, as `git archive` gives it (its CRDs, deploy files).
	Source string
	// Bin holds its programs, named as in Programs.
	Bin string
}

// Binary is the path of one of the build's programs.
func (b Build) Binary(name string) string { return filepath.Join(b.Bin, name) }

// CacheDir is where builds are kept: $FLYTE_RELEASE_CACHE, or flyte-executor/releases
// under the user's cache directory, so a fresh clone reuses them.
func CacheDir() (string, error) {
	if d := os.Getenv("FLYTE_RELEASE_CACHE"); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("release: %w", err)
	}
	return filepath.Join(cache, "flyte-executor", "releases"), nil
}

// Get builds r's programs from its commit in the repository at root, once: a finished
// build is reused, and concurrent callers (test packages run in parallel) wait for the
// one building under a file lock.
func Get(ctx context.Context, root string, r Release) (Build, error) {
	cache, err := CacheDir()
	if err != nil {
		return Build{}, err
	}
	dir := filepath.Join(cache, r.Version+"-"+r.Commit[:12])
	b := Build{Release: r, Source: filepath.Join(dir, "src"), Bin: filepath.Join(dir, "bin")}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return Build{}, fmt.Errorf("release: %w", err)
	}
	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return Build{}, err
	}
	defer unlock()
	done := filepath.Join(dir, "complete")
	if _, err := os.Stat(done); err == nil {
		return b, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return Build{}, fmt.Errorf("release: clearing an unfinished build: %w", err)
	}
	if err := extract(ctx, root, r.Commit, b.Source); err != nil {
		return Build{}, err
	}
	if err := compile(ctx, b); err != nil {
		return Build{}, err
	}
	if err := os.WriteFile(done, []byte(r.Commit+"\n"), 0o644); err != nil {
		return Build{}, fmt.Errorf("release: %w", err)
	}
	return b, nil
}

// extract writes the tree of commit into dir.
func extract(ctx context.Context, root, commit, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	untar.Stdin = pipe
	// One buffer each: each process's stderr is copied by a goroutine of its own.
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return fmt.Errorf("release: tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return fmt.Errorf("release: git archive %s (a shallow clone lacks it: fetch the full history): %w: %s", commit, err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("release: tar: %w: %s", err, untarErr.String())
	}
	return nil
}

// compile builds every program of Programs that the release's tree has.
func compile(ctx context.Context, b Build) error {
	args := []string{"build", "-trimpath", "-o", b.Bin + "/"}
	for _, pkg := range Programs {
		if _, err := os.Stat(filepath.Join(b.Source, pkg)); err == nil {
			args = append(args, pkg)
		}
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = b.Source
	// The release's own go.mod decides its dependencies; a workspace of the caller's
	// must not.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("release: building %s: %w\n%s", b.Version, err, out)
	}
	return nil
}

// lockFile takes an exclusive lock on path, waiting for it as long as ctx allows.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("release: locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("release: waiting for another build of the release: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
