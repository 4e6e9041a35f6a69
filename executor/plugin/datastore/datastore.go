// Package datastore reads and writes the blobs of actions' inputs and outputs through
// gocloud.dev/blob, so the same code serves file://, mem://, s3:// and gs:// URIs. The
// drivers a binary supports are the ones it imports (file and mem always are here; the
// executor's main adds s3 and gs).
//
// A Store reaches any URI; the executor hands actions only a Confined store's view
// (see Confine), which reads and writes under allowed prefixes alone.
package datastore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// URIs
	_ "gocloud.dev/blob/memblob"  // mem:// URIs
	"gocloud.dev/gcerrors"

	"github.com/flytekube/backend/executor/plugin"
)

// Store opens one bucket per scheme and host and keeps it open. It reaches any URI its
// drivers serve: tools and tests use it as it is, the executor through Confine.
type Store struct {
	mu      sync.Mutex
	buckets map[string]*blob.Bucket
}

var _ plugin.DataStore = (*Store)(nil)

// New returns a store with no bucket open yet.
func New() *Store { return &Store{buckets: make(map[string]*blob.Bucket)} }

// split turns a URI into the bucket's URL and the object's key. For file:// the bucket
// is the root directory, so any absolute path works.
func split(uri string) (bucketURL, key string, err error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme == "" {
		return "", "", fmt.Errorf("datastore: %q is not a URI", uri)
	}
	switch u.Scheme {
	case "file":
		if !strings.HasPrefix(u.Path, "/") || len(u.Path) < 2 {
			return "", "", fmt.Errorf("datastore: %q needs an absolute path", uri)
		}
		return "file:///", strings.TrimPrefix(u.Path, "/"), nil
	default:
		key := strings.TrimPrefix(u.Path, "/")
		if u.Host == "" || key == "" {
			return "", "", fmt.Errorf("datastore: %q needs a bucket and a key", uri)
		}
		return u.Scheme + "://" + u.Host, key, nil
	}
}

func (s *Store) bucket(ctx context.Context, bucketURL string) (*blob.Bucket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.buckets[bucketURL]; ok {
		return b, nil
	}
	b, err := blob.OpenBucket(ctx, bucketURL)
	if err != nil {
		return nil, fmt.Errorf("datastore: opening %s: %w", bucketURL, err)
	}
	s.buckets[bucketURL] = b
	return b, nil
}

// Read implements plugin.DataStore.
func (s *Store) Read(ctx context.Context, uri string) ([]byte, error) {
	bucketURL, key, err := split(uri)
	if err != nil {
		return nil, err
	}
	return s.read(ctx, bucketURL, key, uri)
}

// read reads key in the bucket at bucketURL; uri names it in errors.
func (s *Store) read(ctx context.Context, bucketURL, key, uri string) ([]byte, error) {
	b, err := s.bucket(ctx, bucketURL)
	if err != nil {
		return nil, err
	}
	data, err := b.ReadAll(ctx, key)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("datastore: reading %s: %w", uri, plugin.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("datastore: reading %s: %w", uri, err)
	}
	return data, nil
}

// Write implements plugin.DataStore.
func (s *Store) Write(ctx context.Context, uri string, content []byte) error {
	bucketURL, key, err := split(uri)
	if err != nil {
		return err
	}
	return s.write(ctx, bucketURL, key, uri, content)
}

func (s *Store) write(ctx context.Context, bucketURL, key, uri string, content []byte) error {
	b, err := s.bucket(ctx, bucketURL)
	if err != nil {
		return err
	}
	if err := b.WriteAll(ctx, key, content, nil); err != nil {
		return fmt.Errorf("datastore: writing %s: %w", uri, err)
	}
	return nil
}

// Exists implements plugin.DataStore.
func (s *Store) Exists(ctx context.Context, uri string) (bool, error) {
	bucketURL, key, err := split(uri)
	if err != nil {
		return false, err
	}
	return s.exists(ctx, bucketURL, key, uri)
}

func (s *Store) exists(ctx context.Context, bucketURL, key, uri string) (bool, error) {
	b, err := s.bucket(ctx, bucketURL)
	if err != nil {
		return false, err
	}
	ok, err := b.Exists(ctx, key)
	if err != nil {
		return false, fmt.Errorf("datastore: checking %s: %w", uri, err)
	}
	return ok, nil
}

// Close closes every open bucket.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, b := range s.buckets {
		errs = append(errs, b.Close())
	}
	clear(s.buckets)
	return errors.Join(errs...)
}
