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
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// URIs
	_ "gocloud.dev/blob/memblob"  // mem:// URIs
	"gocloud.dev/gcerrors"
	"google.golang.org/api/googleapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// Store opens one bucket per scheme and host and keeps it open. It reaches any URI its
// drivers serve: tools and tests use it as it is, the executor through Confine.
type Store struct {
	mu      sync.Mutex
	buckets map[string]*blob.Bucket
}

var _ core.DataStore = (*Store)(nil)

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

// Read implements core.DataStore.
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
		return nil, fmt.Errorf("datastore: reading %s: %w", uri, core.ErrNotFound)
	}
	if err != nil {
		return nil, storeError("reading", uri, err)
	}
	return data, nil
}

// Write implements core.DataStore.
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
		return storeError("writing", uri, err)
	}
	return nil
}

// Exists implements core.DataStore.
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
		return false, storeError("checking", uri, err)
	}
	return ok, nil
}

// Size implements core.Sizer.
func (s *Store) Size(ctx context.Context, uri string) (int64, error) {
	bucketURL, key, err := split(uri)
	if err != nil {
		return 0, err
	}
	return s.size(ctx, bucketURL, key, uri)
}

func (s *Store) size(ctx context.Context, bucketURL, key, uri string) (int64, error) {
	b, err := s.bucket(ctx, bucketURL)
	if err != nil {
		return 0, err
	}
	attrs, err := b.Attributes(ctx, key)
	if err != nil {
		return 0, storeError("sizing", uri, err)
	}
	return attrs.Size, nil
}

// storeError wraps a bucket's error with what was done, keeping it (and so its gcerrors
// code) in the chain, and marks it transient when the store, not the request, failed:
// the step is then retried after a backoff without charging the action. What retrying
// cannot change (permission denied, an invalid argument, an error nothing says more
// of) stays a plain error.
func storeError(op, uri string, err error) error {
	wrapped := fmt.Errorf("datastore: %s %s: %w", op, uri, err)
	if transient(err) {
		return core.Transient(wrapped)
	}
	return wrapped
}

func transient(err error) bool {
	switch gcerrors.Code(err) {
	case gcerrors.DeadlineExceeded, gcerrors.ResourceExhausted, gcerrors.Internal, gcerrors.Canceled:
		return true
	case gcerrors.Unknown:
		// gcerrors has no Unavailable: the s3 and gcs drivers report a 503, a 500 or a
		// reset connection as Unknown, so the driver's own error beneath decides.
		return unavailable(err)
	}
	return false
}

func unavailable(err error) bool {
	var withHTTP interface{ HTTPStatusCode() int } // the AWS SDK's ResponseError
	if errors.As(err, &withHTTP) {
		return retryableStatus(withHTTP.HTTPStatusCode())
	}
	var jsonAPI *googleapi.Error // gcs over its JSON API, which gcsblob maps only for 403, 404, 412 and 429
	if errors.As(err, &jsonAPI) {
		return retryableStatus(jsonAPI.Code)
	}
	var withGRPC interface{ GRPCStatus() *status.Status } // gcs over gRPC
	if errors.As(err, &withGRPC) {
		switch withGRPC.GRPCStatus().Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Internal:
			return true
		}
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE)
}

// retryableStatus says an HTTP status is the store's bad moment, not the request's fault.
func retryableStatus(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= http.StatusInternalServerError
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
