package datastore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/storage"
)

// TestCopiesStreamWithinTheLimit: Copy moves an object between file:// and buckets
// either way, whole when it is within the copy limit; over it, nothing is written, and
// a sparse 64 GiB file is refused without being read.
func TestCopiesStreamWithinTheLimit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const limit = 4096
	c, err := datastore.Confine(datastore.NewLimited(datastore.Limits{MaxCopyBytes: limit}), []string{"file://" + dir, "mem://copies/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	sparseFile(t, filepath.Join(dir, "sparse.json"), sparse64GiB)
	bases := map[string]string{"file": "file://" + dir, "mem": "mem://copies"}
	for _, from := range []string{"file", "mem"} {
		for _, to := range []string{"file", "mem"} {
			for _, size := range []int{0, limit, limit + 1} {
				t.Run(fmt.Sprintf("%s-to-%s-%d", from, to, size), func(t *testing.T) {
					src := fmt.Sprintf("%s/src-%d.json", bases[from], size)
					dst := fmt.Sprintf("%s/dst/%s-%d.json", bases[to], from, size)
					content := []byte(strings.Repeat("x", size))
					if err := c.Write(ctx, src, content); err != nil {
						t.Fatal(err)
					}
					err := c.Copy(ctx, src, dst)
					if size > limit {
						wantTooLarge(t, err, src, datastore.SettingMaxCopyBytes)
						if ok, err := c.Exists(ctx, dst); err != nil || ok {
							t.Fatalf("a refused copy left %s: %v, %v", dst, ok, err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if got, err := c.Read(ctx, dst); err != nil || string(got) != string(content) {
						t.Fatalf("the copy holds %d bytes, %v; want %d", len(got), err, size)
					}
				})
			}
		}
	}
	t.Run("sparse", func(t *testing.T) {
		src, dst := "file://"+dir+"/sparse.json", "file://"+dir+"/dst/sparse.json"
		var err error
		grew := allocatedDuring(func() { err = c.Copy(ctx, src, dst) })
		wantTooLarge(t, err, src, datastore.SettingMaxCopyBytes)
		if grew > 64<<20 {
			t.Fatalf("refusing the copy allocated %d MiB", grew>>20)
		}
	})
	entries, err := os.ReadDir(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("a refused copy left %s behind", e.Name())
		}
	}
	if err := c.Copy(ctx, "mem://copies/none.json", "mem://copies/dst/none.json"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("copying what is not there: %v; want not found", err)
	}
	if err := c.Copy(ctx, "mem://elsewhere/x.json", "mem://copies/dst/x.json"); !errors.Is(err, storage.ErrNotAllowed) {
		t.Fatalf("copying from outside the prefixes: %v; want not allowed", err)
	}
}
