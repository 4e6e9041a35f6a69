package datastore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"gocloud.dev/blob"

	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/datastore/storetest"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/storage"
)

// sparse64GiB is the size of the file a hostile task leaves: on disk it costs nothing.
const sparse64GiB = 64 << 30

// sparseFile makes a sparse file of size bytes at name.
func sparseFile(t *testing.T, name string, size int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Truncate(size), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// allocatedDuring is how many bytes of heap fn allocated, freed or not.
func allocatedDuring(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// wantTooLarge fails unless err is the limit error naming the object and the setting.
func wantTooLarge(t *testing.T, err error, uri, setting string) {
	t.Helper()
	if !errors.Is(err, storage.ErrTooLarge) {
		t.Fatalf("got %v; want the data store's limit error", err)
	}
	if msg := err.Error(); !strings.Contains(msg, uri) || !strings.Contains(msg, setting) {
		t.Fatalf("%q names not both %s and %s", msg, uri, setting)
	}
	if core.IsTransient(err) {
		t.Fatalf("%v is transient: retrying cannot make the object smaller", err)
	}
}

// TestASparseFileIsRefusedWithoutBeingRead: an error document a task made a sparse 64 GiB
// file is refused for its size, at once, and the executor's heap does not grow: before,
// it was read whole, which took the executor down.
func TestASparseFileIsRefusedWithoutBeingRead(t *testing.T) {
	ctx := context.Background()
	d := newDisk(t)
	sparseFile(t, filepath.Join(d.allowed, "r1/a0/1/error.json"), sparse64GiB)
	c := confine(t, "file://"+d.allowed)
	uri := "file://" + d.allowed + "/r1/a0/1/error.json"
	var err error
	grew := allocatedDuring(func() { _, err = c.Read(ctx, uri) })
	wantTooLarge(t, err, uri, datastore.SettingMaxDocumentBytes)
	if !strings.Contains(err.Error(), fmt.Sprint(int64(sparse64GiB))) {
		t.Errorf("%q does not say how large the object is", err)
	}
	if grew > 64<<20 {
		t.Fatalf("refusing the file allocated %d MiB", grew>>20)
	}
	t.Logf("refusing a sparse 64 GiB file allocated %d KiB", grew>>10)
}

// TestReadsStopAtTheDocumentLimit: an object one byte over the limit is refused, on disk
// and in a bucket; one at the limit is read.
func TestReadsStopAtTheDocumentLimit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	limits := datastore.Limits{MaxDocumentBytes: 1024}
	c, err := datastore.Confine(datastore.NewLimited(limits), []string{"file://" + dir, "mem://limits/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, base := range []string{"file://" + dir, "mem://limits"} {
		for _, size := range []int{1024, 1025} {
			t.Run(fmt.Sprintf("%s/%d", strings.Split(base, ":")[0], size), func(t *testing.T) {
				uri := fmt.Sprintf("%s/%d.json", base, size)
				if err := c.Write(ctx, uri, make([]byte, size)); err != nil {
					t.Fatal(err)
				}
				got, err := c.Read(ctx, uri)
				if size <= 1024 {
					if err != nil || len(got) != size {
						t.Fatalf("read %d bytes, %v; want %d", len(got), err, size)
					}
					return
				}
				wantTooLarge(t, err, uri, datastore.SettingMaxDocumentBytes)
			})
		}
	}
}

// TestAStagedInputIsACopy: the file a pod mounts as its input is a copy of the stored
// object, not a hard link to it: writing it changes nothing in the data store.
func TestAStagedInputIsACopy(t *testing.T) {
	d := newDisk(t)
	stored := filepath.Join(d.allowed, "r1/inputs.json")
	if err := os.MkdirAll(filepath.Dir(stored), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stored, []byte(`{"x": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	store := hostPaths(t, confine(t, "file://"+d.allowed))
	m, err := store.StageInput(context.Background(), "file://"+stored, "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	storedInfo, err := os.Stat(stored)
	if err != nil {
		t.Fatal(err)
	}
	stagedInfo, err := os.Stat(m.Source)
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(storedInfo, stagedInfo) {
		t.Fatalf("%s is the stored object itself", m.Source)
	}
	for name, fi := range map[string]os.FileInfo{"stored": storedInfo, "staged": stagedInfo} {
		if n := fi.Sys().(*syscall.Stat_t).Nlink; n != 1 {
			t.Errorf("the %s file has %d links; want 1", name, n)
		}
	}
	if got, err := os.ReadFile(m.Source); err != nil || string(got) != `{"x": 1}` {
		t.Fatalf("the staged input holds %q, %v", got, err)
	}
	// What a pod with a writable mount of it would do.
	if err := os.WriteFile(m.Source, []byte(`{"x": "rewritten"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(stored); err != nil || string(got) != `{"x": 1}` {
		t.Fatalf("writing the staged input changed the stored object: %q, %v", got, err)
	}
}

// TestAStagedInputIsBounded: a sparse 64 GiB input is not staged, and costs nothing.
func TestAStagedInputIsBounded(t *testing.T) {
	d := newDisk(t)
	stored := filepath.Join(d.allowed, "r1/inputs.json")
	sparseFile(t, stored, sparse64GiB)
	store := hostPaths(t, confine(t, "file://"+d.allowed))
	var err error
	grew := allocatedDuring(func() { _, err = store.StageInput(context.Background(), "file://"+stored, "uid-1") })
	wantTooLarge(t, err, "file://"+stored, datastore.SettingMaxCopyBytes)
	if grew > 64<<20 {
		t.Fatalf("refusing the input allocated %d MiB", grew>>20)
	}
	entries, err := os.ReadDir(filepath.Join(d.allowed, datastore.StagingDir, "uid-1", "in"))
	if err != nil || len(entries) != 0 {
		t.Fatalf("the staged input directory holds %v, %v; want nothing", entries, err)
	}
}

// TestOutputTreesAreBounded: a tree a pod leaves with more entries, or deeper, than the
// bounds is not collected, and the error names the bound; one within them is, whole.
func TestOutputTreesAreBounded(t *testing.T) {
	small := datastore.Limits{MaxOutputEntries: 100, MaxOutputDepth: 8}
	flat := func(n int) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			for i := range n {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	deep := func(levels int) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			parts := make([]string, levels)
			for i := range parts {
				parts[i] = "d"
			}
			nested := filepath.Join(append([]string{dir}, parts...)...)
			if err := os.MkdirAll(nested, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(nested, "leaf"), []byte("leaf"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name    string
		limits  datastore.Limits
		make    func(t *testing.T, dir string)
		entries int    // collected when within bounds
		setting string // the bound met, or "" for none
	}{
		{"wide within", small, flat(100), 100, ""},
		{"wide", small, flat(101), 0, datastore.SettingMaxOutputEntries},
		{"deep within", small, deep(8), 9, ""},
		{"deep", small, deep(9), 0, datastore.SettingMaxOutputDepth},
		{"deeper than the old cut", datastore.Limits{MaxOutputDepth: 80}, deep(70), 71, ""},
		{"wide at the default bound", datastore.DefaultLimits(), flat(datastore.DefaultLimits().MaxOutputEntries + 1), 0, datastore.SettingMaxOutputEntries},
		{"deep at the default bound", datastore.DefaultLimits(), deep(datastore.DefaultLimits().MaxOutputDepth + 1), 0, datastore.SettingMaxOutputDepth},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			d := newDisk(t)
			c, err := datastore.Confine(datastore.NewLimited(tt.limits), []string{"file://" + d.allowed})
			if err != nil {
				t.Fatal(err)
			}
			store := hostPaths(t, c)
			uri := "file://" + d.allowed + "/r1/a0/1"
			m, err := store.StageOutput(ctx, uri, "uid-1")
			if err != nil {
				t.Fatal(err)
			}
			tt.make(t, m.Source)
			err = store.CollectOutput(ctx, uri, "uid-1")
			if tt.setting != "" {
				wantTooLarge(t, err, uri, tt.setting)
				if _, err := os.Lstat(filepath.Join(d.allowed, "r1")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("part of a tree over the bound was collected: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			if err := filepath.WalkDir(filepath.Join(d.allowed, "r1/a0/1"), func(_ string, _ os.DirEntry, err error) error {
				n++
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if n-1 != tt.entries { // the walk counts the root
				t.Fatalf("collected %d entries; want %d", n-1, tt.entries)
			}
		})
	}
}

// stalled:// URIs are in-memory buckets whose calls can be made to hang.
var stalled = storetest.Register("stalled")

// TestAStalledStoreCallEndsAtItsDeadline: a store that stops answering holds a call only
// until its deadline, and the error is transient (retried later, not charged to the
// action).
func TestAStalledStoreCallEndsAtItsDeadline(t *testing.T) {
	ctx := context.Background()
	if err := stalled.Real("data").WriteAll(ctx, "r1/in.json", []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	store := datastore.NewLimited(datastore.Limits{CallTimeout: 100 * time.Millisecond, CopyTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = store.Close() })
	tests := []struct {
		name string
		op   storetest.Op
		call func() error
	}{
		{"read", storetest.OpRead, func() error { _, err := store.Read(ctx, "stalled://data/r1/in.json"); return err }},
		{"write", storetest.OpWrite, func() error { return store.Write(ctx, "stalled://data/r1/out.json", []byte("{}")) }},
		{"exists", storetest.OpExists, func() error { _, err := store.Exists(ctx, "stalled://data/r1/in.json"); return err }},
		{"size", storetest.OpExists, func() error { _, err := store.Size(ctx, "stalled://data/r1/in.json"); return err }},
		{"copy's read", storetest.OpRead, func() error { return store.Copy(ctx, "stalled://data/r1/in.json", "stalled://data/r1/copy.json") }},
		{"copy's write", storetest.OpWrite, func() error { return store.Copy(ctx, "stalled://data/r1/in.json", "stalled://data/r1/copy.json") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stalled.Stall(tt.op, "r1/", 1)
			t.Cleanup(stalled.Clear)
			done := make(chan error, 1)
			go func() { done <- tt.call() }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) || !core.IsTransient(err) {
					t.Fatalf("got %v; want a transient deadline exceeded", err)
				}
			case <-time.After(time.Minute): // far past the deadline: the call has none
				t.Fatal("the stalled call is still waiting")
			}
			if stalled.Pending() != 0 {
				t.Fatal("the call never reached the store")
			}
		})
	}
}

// slowOpener opens buckets of its scheme only once released, as a driver fetching
// credentials from a metadata server that stalls.
type slowOpener struct{ entered, release chan struct{} }

func (o slowOpener) OpenBucketURL(ctx context.Context, u *url.URL) (*blob.Bucket, error) {
	close(o.entered)
	select {
	case <-o.release:
		return blob.OpenBucket(ctx, "mem://")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var slowOpen = slowOpener{entered: make(chan struct{}), release: make(chan struct{})}

func init() { blob.DefaultURLMux().RegisterBucket("slowopen", slowOpen) }

// TestOpeningABucketHoldsUpOnlyItsCallers: while one bucket takes long to open, calls of
// another bucket go on.
func TestOpeningABucketHoldsUpOnlyItsCallers(t *testing.T) {
	ctx := context.Background()
	store := datastore.New()
	t.Cleanup(func() { _ = store.Close() })
	opening := make(chan error, 1)
	go func() { _, err := store.Read(ctx, "slowopen://b/x.json"); opening <- err }()
	<-slowOpen.entered
	other := make(chan error, 1)
	go func() { _, err := store.Read(ctx, "mem://other/x.json"); other <- err }()
	select {
	case err := <-other:
		if !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("reading another bucket: %v; want not found", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a call of another bucket waited for the opening one")
	}
	close(slowOpen.release)
	if err := <-opening; !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("reading the slow bucket once open: %v; want not found", err)
	}
}
