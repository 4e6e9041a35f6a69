package datastore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/storage"
)

const secret = "token-of-the-executor"

// disk lays out an allowed directory and, beside it, a secret the data store must never
// read: a file outside, the same under a sibling whose name starts like the allowed
// one's, and symbolic links inside the allowed directory that lead to it.
type disk struct{ allowed, outside, sibling string }

func newDisk(t *testing.T) disk {
	t.Helper()
	root := t.TempDir()
	d := disk{allowed: filepath.Join(root, "data"), outside: filepath.Join(root, "secrets"), sibling: filepath.Join(root, "data-evil")}
	for _, dir := range []string{d.allowed, d.outside, d.sibling} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(d.outside, "token"), filepath.Join(d.sibling, "token")} {
		if err := os.WriteFile(f, []byte(secret), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(d.outside, filepath.Join(d.allowed, "abs-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../secrets", filepath.Join(d.allowed, "rel-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(d.outside, "token"), filepath.Join(d.allowed, "token-link")); err != nil {
		t.Fatal(err)
	}
	return d
}

func confine(t *testing.T, allowed ...string) *datastore.Confined {
	t.Helper()
	c, err := datastore.Confine(datastore.New(), allowed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestConfinedRefusesEverythingOutsideItsPrefixes: every way out of an allowed file://
// prefix is refused as not allowed, before anything is read or written.
func TestConfinedRefusesEverythingOutsideItsPrefixes(t *testing.T) {
	ctx := context.Background()
	d := newDisk(t)
	c := confine(t, "file://"+d.allowed, "mem://data/{project}/{domain}/")
	allowed := "file://" + d.allowed

	if err := c.Write(ctx, allowed+"/r1/a0/1/outputs.json", []byte(`{"x":1}`)); err != nil {
		t.Fatalf("writing under the allowed prefix: %v", err)
	}
	if got, err := c.Read(ctx, allowed+"/r1/a0/1/outputs.json"); err != nil || string(got) != `{"x":1}` {
		t.Fatalf("reading under the allowed prefix: %q, %v", got, err)
	}
	if err := c.Write(ctx, "mem://data/p1/dev/x.json", []byte("m")); err != nil {
		t.Fatalf("writing under a templated prefix: %v", err)
	}

	for _, uri := range []string{
		"file://" + d.outside + "/token",
		"file:///var/run/secrets/kubernetes.io/serviceaccount/token",
		"file://" + d.sibling + "/token", // starts like the allowed directory's name
		allowed + "/../secrets/token",
		allowed + "/r1/../../secrets/token",
		allowed + "/%2e%2e/secrets/token",
		allowed + "%2F..%2Fsecrets/token",
		allowed + "/r1%2F..%2F..%2Fsecrets%2Ftoken",
		allowed + "/abs-link/token", // an absolute symbolic link out
		allowed + "/rel-link/token", // a relative one
		allowed + "/token-link",     // a link to the file itself
		"file://localhost" + d.outside + "/token",
		"s3://bucket" + d.allowed + "/x.json", // another scheme, same path
		"gs://bucket/x.json",
		"http://169.254.169.254/latest/meta-data/iam",
		"mem://other/x.json",
		"mem://data/p1/x.json", // above the templated part
		allowed,                // the prefix itself
		allowed + "/x.json?y=1",
	} {
		got, err := c.Read(ctx, uri)
		if !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Read(%s) = %q, %v; want ErrNotAllowed", uri, got, err)
		}
		if strings.Contains(string(got), secret) {
			t.Errorf("Read(%s) returned the secret", uri)
		}
		var refused *storage.NotAllowedError
		if strings.Contains(uri, "-link") && (!errors.As(err, &refused) || refused.Reason != storage.ReasonSymlink) {
			t.Errorf("Read(%s) = %v; want it refused for its symbolic link", uri, err)
		}
		if ok, err := c.Exists(ctx, uri); ok || !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Exists(%s) = %v, %v; want ErrNotAllowed", uri, ok, err)
		}
		// Writes are tried only where a failing test cannot harm the machine.
		if strings.HasPrefix(uri, "file:///var/") {
			continue
		}
		err = c.Write(ctx, uri, []byte("overwritten"))
		if strings.HasSuffix(uri, "/token-link") {
			// A write replaces the link itself, inside the prefix; the secret it pointed
			// at stays as it was (checked below).
			if err != nil {
				t.Errorf("Write(%s) = %v; want the link replaced", uri, err)
			}
			continue
		}
		if !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Write(%s) = %v; want ErrNotAllowed", uri, err)
		}
	}
	for _, f := range []string{filepath.Join(d.outside, "token"), filepath.Join(d.sibling, "token")} {
		if got, _ := os.ReadFile(f); string(got) != secret {
			t.Errorf("%s was overwritten: %q", f, got)
		}
	}
}

// TestConfinedFileWritesArePlainFiles: outputs on file:// are ordinary files that tasks
// and people can read, with no sidecar.
func TestConfinedFileWritesArePlainFiles(t *testing.T) {
	ctx := context.Background()
	d := newDisk(t)
	c := confine(t, "file://"+d.allowed+"/")
	uri := "file://" + d.allowed + "/r1/a0/1/outputs.json"
	if ok, err := c.Exists(ctx, uri); ok || err != nil {
		t.Fatalf("Exists before Write = %v, %v", ok, err)
	}
	if _, err := c.Read(ctx, uri); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Read before Write = %v; want ErrNotFound", err)
	}
	for _, content := range []string{"first", "second"} {
		if err := c.Write(ctx, uri, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := c.Exists(ctx, uri); !ok || err != nil {
		t.Fatalf("Exists after Write = %v, %v", ok, err)
	}
	entries, _ := os.ReadDir(filepath.Join(d.allowed, "r1", "a0", "1"))
	if len(entries) != 1 || entries[0].Name() != "outputs.json" {
		t.Fatalf("the directory holds %v; want outputs.json alone", entries)
	}
	if got, _ := os.ReadFile(filepath.Join(d.allowed, "r1", "a0", "1", "outputs.json")); string(got) != "second" {
		t.Fatalf("the file holds %q", got)
	}
	// A directory is no blob.
	if ok, err := c.Exists(ctx, "file://"+d.allowed+"/r1"); ok || err != nil {
		t.Fatalf("Exists(directory) = %v, %v", ok, err)
	}
}

func actionIn(project, domain, input, outputBase string) *flytev1.TaskAction {
	return &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{Project: project, Domain: domain, ActionName: "a0",
		InputURI: input, RunOutputBase: outputBase}}
}

// TestActionViewKeepsProjectsApart: an action reads and writes only its own project's
// and domain's part of a templated prefix, even where a plain prefix would cover
// another's part.
func TestActionViewKeepsProjectsApart(t *testing.T) {
	ctx := context.Background()
	d := newDisk(t)
	shared := "file://" + d.allowed
	c := confine(t, shared, shared+"/projects/{project}/{domain}", "mem://data/{project}/{domain}/")
	for _, uri := range []string{shared + "/projects/p2/dev/r9/a0/1/outputs.json", shared + "/projects/p1/prod/r9/a0/1/outputs.json", "mem://data/p2/dev/x",
		shared + "/projects/p2/notes.json", shared + "/projects/p1/notes.json"} {
		if err := c.Write(ctx, uri, []byte("theirs")); err != nil {
			t.Fatal(err)
		}
	}
	view := c.ForAction(actionIn("p1", "dev", shared+"/projects/p1/dev/in.json", shared+"/projects/p1/dev/r1"))

	for _, uri := range []string{shared + "/projects/p1/dev/r1/a0/1/outputs.json", shared + "/shared/x.json", "mem://data/p1/dev/x"} {
		if err := view.Write(ctx, uri, []byte("mine")); err != nil {
			t.Errorf("Write(%s) = %v; want it allowed", uri, err)
		}
	}
	for _, uri := range []string{
		shared + "/projects/p2/dev/r9/a0/1/outputs.json",  // another project
		shared + "/projects/p1/prod/r9/a0/1/outputs.json", // another domain
		"mem://data/p2/dev/x",
		// Above the domain level, where the plain prefix alone would match: the template
		// gives these paths to project p2, to p2's root, and to p1's domain "notes.json".
		shared + "/projects/p2/notes.json",
		shared + "/projects/p2",
		shared + "/projects/p1/notes.json",
	} {
		got, err := view.Read(ctx, uri)
		var refused *storage.NotAllowedError
		if !errors.As(err, &refused) || refused.Reason != storage.ReasonOtherProject {
			t.Errorf("Read(%s) = %q, %v; want refused as another project's", uri, got, err)
		}
		if err := view.Write(ctx, uri, []byte("mine")); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Write(%s) = %v; want ErrNotAllowed", uri, err)
		}
	}
	// An action whose project cannot be a path segment gets no templated part at all.
	odd := c.ForAction(actionIn("", "dev", "", shared+"/projects/p1/dev/r1"))
	if err := odd.Write(ctx, "mem://data/p1/dev/x", []byte("x")); !errors.Is(err, storage.ErrNotAllowed) {
		t.Errorf("an action without a project wrote into a project's part: %v", err)
	}
}

// TestActionViewWithoutPrefixes: with no prefixes configured each action may read its
// inputs and read and write under its run's output base, and nothing else; file:// is
// never derived from an action.
func TestActionViewWithoutPrefixes(t *testing.T) {
	ctx := context.Background()
	c := confine(t)
	if err := c.Write(ctx, "mem://in/r1/inputs.json", nil); !errors.Is(err, storage.ErrNotAllowed) {
		t.Fatalf("with no prefixes, the store itself wrote: %v", err)
	}
	view := c.ForAction(actionIn("p1", "dev", "mem://in/r1/inputs.json", "mem://out/r1"))
	if err := view.Write(ctx, "mem://out/r1/a0/1/outputs.json", []byte("o")); err != nil {
		t.Fatalf("writing under the run's output base: %v", err)
	}
	if got, err := view.Read(ctx, "mem://out/r1/a0/1/outputs.json"); err != nil || string(got) != "o" {
		t.Fatalf("reading it back: %q, %v", got, err)
	}
	if _, err := view.Read(ctx, "mem://in/r1/inputs.json"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("reading the inputs: %v; want allowed (and not found)", err)
	}
	for _, uri := range []string{"mem://in/r1/inputs.json", "mem://in/r1/other.json", "mem://out/r2/a0/1/outputs.json", "mem://out/r1-x/y"} {
		if err := view.Write(ctx, uri, []byte("x")); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Write(%s) = %v; want ErrNotAllowed", uri, err)
		}
	}
	for _, uri := range []string{"mem://in/r1/other.json", "mem://out/r2/a0/1/outputs.json", "mem://out/r1"} {
		if _, err := view.Read(ctx, uri); !errors.Is(err, storage.ErrNotAllowed) {
			t.Errorf("Read(%s) = %v; want ErrNotAllowed", uri, err)
		}
	}

	d := newDisk(t)
	fileAction := c.ForAction(actionIn("p1", "dev", "file://"+d.outside+"/token", "file://"+d.allowed))
	if got, err := fileAction.Read(ctx, "file://"+d.outside+"/token"); !errors.Is(err, storage.ErrNotAllowed) {
		t.Fatalf("an action's own file:// inputs were read without a configured prefix: %q, %v", got, err)
	}
	if err := fileAction.Write(ctx, "file://"+d.allowed+"/a0/1/outputs.json", nil); !errors.Is(err, storage.ErrNotAllowed) {
		t.Fatalf("an action's own file:// output base was written without a configured prefix: %v", err)
	}
}

// TestExecutionContextUsesTheActionsView: plugins get the action's view, not the store.
func TestExecutionContextUsesTheActionsView(t *testing.T) {
	ctx := context.Background()
	c := confine(t, "mem://data/{project}/{domain}/")
	ta := actionIn("p1", "dev", "mem://data/p2/dev/inputs.json", "mem://data/p1/dev/r1")
	tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: c})
	if _, err := tCtx.InputReader().Read(ctx); !errors.Is(err, storage.ErrNotAllowed) {
		t.Fatalf("inputs in another project's part: %v; want ErrNotAllowed", err)
	}
	if _, err := tCtx.DataStore().Read(ctx, "mem://data/p2/dev/x"); !errors.Is(err, storage.ErrNotAllowed) {
		t.Fatalf("DataStore() read another project's part: %v", err)
	}
	if _, err := tCtx.OutputWriter().Write(ctx, []byte("o")); err != nil {
		t.Fatalf("writing outputs: %v", err)
	}
}

func TestConfineRefusesBadPrefixes(t *testing.T) {
	for _, p := range []string{"file:///", "file:///proc", "s3://b/{team}/", "data/", "s3://b/x?y"} {
		if _, err := datastore.Confine(datastore.New(), []string{p}); err == nil {
			t.Errorf("Confine(%q) succeeded", p)
		}
	}
}

// TestStagedMountsStayInsideThePrefix: what a pod would mount is in its attempt's
// staging directory inside the action's prefix, made with no symbolic link on the way,
// and nothing outside the action's part is staged.
func TestStagedMountsStayInsideThePrefix(t *testing.T) {
	d := newDisk(t)
	if err := os.WriteFile(filepath.Join(d.allowed, "inputs.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(d.allowed, "inputs.json"), filepath.Join(d.allowed, "inner-link")); err != nil {
		t.Fatal(err)
	}
	store := hostPaths(t, confine(t, "file://"+d.allowed))
	in := "file://" + d.allowed
	staging := filepath.Join(d.allowed, datastore.StagingDir, "uid-1")
	for _, tc := range []struct {
		name, uri, attempt string
		dir                bool
		want               storage.HostMount // empty: refused
		notAllowed         bool              // refused as ErrNotAllowed (not merely missing or of another kind)
	}{
		{"output directory", in + "/run/a/1", "uid-1", true,
			storage.HostMount{Source: filepath.Join(staging, "out"), Target: filepath.Join(d.allowed, "run/a/1")}, false},
		{"input file", in + "/inputs.json", "uid-1", false,
			storage.HostMount{Source: filepath.Join(staging, "in/inputs.json"), Target: filepath.Join(d.allowed, "inputs.json")}, false},
		{"directory through a link out", in + "/abs-link/x", "uid-1", true, storage.HostMount{}, true},
		{"file through a link out", in + "/abs-link/token", "uid-1", false, storage.HostMount{}, true},
		{"file that is a link out", in + "/token-link", "uid-1", false, storage.HostMount{}, true},
		{"file that is a link inside", in + "/inner-link", "uid-1", false, storage.HostMount{}, true},
		{"dot-dot out", in + "/../secrets", "uid-1", true, storage.HostMount{}, true},
		{"sibling", "file://" + d.sibling + "/token", "uid-1", false, storage.HostMount{}, true},
		{"into the staging directories", in + "/" + datastore.StagingDir + "/uid-2/out", "uid-1", true, storage.HostMount{}, true},
		{"an attempt that is a path", in + "/run/a/1", "../../x", true, storage.HostMount{}, false},
		{"missing file", in + "/nothing.json", "uid-1", false, storage.HostMount{}, false},
		{"a directory as a file", in + "/abs-link", "uid-1", false, storage.HostMount{}, true},
		{"not under the prefix", "mem://b/x", "uid-1", true, storage.HostMount{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stage := store.StageInput
			if tc.dir {
				stage = store.StageOutput
			}
			got, err := stage(context.Background(), tc.uri, tc.attempt)
			if tc.want == (storage.HostMount{}) {
				if err == nil || tc.notAllowed != errors.Is(err, storage.ErrNotAllowed) {
					t.Fatalf("got %+v, %v; want refused (not allowed: %v)", got, err, tc.notAllowed)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			if fi, err := os.Lstat(got.Source); err != nil || fi.IsDir() != tc.dir || !tc.dir && !fi.Mode().IsRegular() {
				t.Fatalf("%s: %v, %v", got.Source, fi, err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(d.outside, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a directory was made outside: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.allowed, "run")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the output directory was made in the data store before the pod ran: %v", err)
	}
}

// TestNoPodWritesOnAnotherPodsMountPath: an action whose input and output base lie inside
// another action's output still gets mounts whose host paths pass through nothing the
// other's pod can write (its staged output), nor through the data store's directories.
func TestNoPodWritesOnAnotherPodsMountPath(t *testing.T) {
	d := newDisk(t)
	store := hostPaths(t, confine(t, "file://"+d.allowed))
	ctx := context.Background()
	in := "file://" + d.allowed
	first, err := store.StageOutput(ctx, in+"/run/first/1", "first-1")
	if err != nil {
		t.Fatal(err)
	}
	// The first attempt's output, collected, holds the second's input.
	if err := os.WriteFile(filepath.Join(first.Source, "outputs.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := store.CollectOutput(ctx, in+"/run/first/1", "first-1"); err != nil {
		t.Fatal(err)
	}
	input, err := store.StageInput(ctx, in+"/run/first/1/outputs.json", "second-1")
	if err != nil {
		t.Fatal(err)
	}
	output, err := store.StageOutput(ctx, in+"/run/first/1/nest/second/1", "second-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []storage.HostMount{input, output} {
		for _, writable := range []string{first.Source, first.Target} {
			if m.Source == writable || strings.HasPrefix(m.Source, writable+"/") {
				t.Errorf("%s is mounted through %s, which a pod can or could write", m.Source, writable)
			}
		}
	}
}

// TestCollectOutputMovesFilesAndLeavesLinks: what the pod wrote reaches the output URI,
// merged into what is there; links it made (out of the prefix, or into another part of
// it) and anything not a file or directory are left behind and removed.
func TestCollectOutputMovesFilesAndLeavesLinks(t *testing.T) {
	d := newDisk(t)
	c := confine(t, "file://"+d.allowed)
	store := hostPaths(t, c)
	ctx := context.Background()
	uri := "file://" + d.allowed + "/run/a/1"
	m, err := store.StageOutput(ctx, uri, "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(d.allowed, "run/a/1")
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{filepath.Join(target, "outputs.json"): "old", filepath.Join(target, "kept"): "kept",
		filepath.Join(m.Source, "outputs.json"): "new", filepath.Join(m.Source, "sub/deep/file"): "deep"} {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, to := range map[string]string{"token": filepath.Join(d.outside, "token"), "secrets": d.outside, "sub/inputs": "../../../../inputs.json"} {
		if err := os.Symlink(to, filepath.Join(m.Source, name)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // the second does nothing more
		if err := store.CollectOutput(ctx, uri, "uid-1"); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"outputs.json": "new", "kept": "kept", "sub/deep/file": "deep"} {
		if got, err := c.Read(ctx, uri+"/"+name); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"token", "secrets", "sub/inputs"} {
		if _, err := os.Lstat(filepath.Join(target, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was collected: %v", name, err)
		}
	}
	if _, err := os.Lstat(m.Source); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the staged output is still there: %v", err)
	}
	if err := store.Unstage(ctx, uri, "uid-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Dir(m.Source)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the staging directory is still there after Unstage: %v", err)
	}
	if err := store.Unstage(ctx, "file://"+d.allowed+"/nowhere/x", "uid-1"); err != nil {
		t.Errorf("unstaging what was never staged: %v", err)
	}
}

func hostPaths(t *testing.T, c *datastore.Confined) storage.HostPathStore {
	t.Helper()
	action := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{Project: "p", Domain: "d"}}
	store, ok := c.ForAction(action).(storage.HostPathStore)
	if !ok {
		t.Fatal("an action's view of a confined store has no host paths")
	}
	return store
}
