package datastore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/storage"
)

func TestReadWriteExists(t *testing.T) {
	dir := t.TempDir()
	for _, base := range []string{"file://" + dir, "mem://bucket"} {
		t.Run(strings.Split(base, ":")[0], func(t *testing.T) {
			ctx := context.Background()
			s := datastore.New()
			defer func() { _ = s.Close() }()
			uri := base + "/r1/a0/1/outputs.json"

			if ok, err := s.Exists(ctx, uri); err != nil || ok {
				t.Fatalf("Exists before Write = %v, %v", ok, err)
			}
			if _, err := s.Read(ctx, uri); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("Read before Write: %v; want ErrNotFound", err)
			}
			if err := s.Write(ctx, uri, []byte(`{"x":1}`)); err != nil {
				t.Fatal(err)
			}
			got, err := s.Read(ctx, uri)
			if err != nil || string(got) != `{"x":1}` {
				t.Fatalf("Read = %q, %v", got, err)
			}
			if ok, err := s.Exists(ctx, uri); err != nil || !ok {
				t.Fatalf("Exists after Write = %v, %v", ok, err)
			}
		})
	}
	// file:// URIs are plain files, so tasks and people can read them.
	if got, err := os.ReadFile(filepath.Join(dir, "r1", "a0", "1", "outputs.json")); err != nil || string(got) != `{"x":1}` {
		t.Fatalf("the file holds %q, %v", got, err)
	}
}

func TestBadURIs(t *testing.T) {
	s := datastore.New()
	for _, uri := range []string{"", "relative/path", "file://relative", "s3://", "mem://bucket", "nope://x/y"} {
		if _, err := s.Read(context.Background(), uri); err == nil || errors.Is(err, storage.ErrNotFound) {
			t.Errorf("Read(%q) = %v; want a clear error", uri, err)
		}
	}
}
