// Package datastore reads and writes the blobs of actions' inputs and outputs through
// gocloud.dev/blob, so the same code serves file://, mem://, s3:// and gs:// URIs. The
// drivers a binary supports are the ones it imports (file and mem always are here; the
// executor's main adds s3 and gs).
//
// A Store reaches any URI; the executor hands actions only a Confined store's view
// (see Confine), which reads and writes under allowed prefixes alone. Both implement the
// contract of package storage, which owns the interfaces and the errors they return.
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
	"golang.org/x/sync/singleflight"
	"google.golang.org/api/googleapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/storage"
)

// Store opens one bucket per scheme and host and keeps it open. It reaches any URI its
// drivers serve: tools and tests use it as it is, the executor through Confine. Every
// call has a deadline and every read and copy a size limit (Limits).
type Store struct {
	limits Limits
	// mu guards buckets; it is never held while a bucket opens, which may take long
	// (a driver fetching credentials): opening holds up the callers of that bucket only.
	mu      sync.Mutex
	buckets map[string]*blob.Bucket
	opening singleflight.Group
}

var (
	_ storage.DataStore = (*Store)(nil)
	_ storage.Copier    = (*Store)(nil)
)

// New returns a store with the default limits and no bucket open yet.
func New() *Store { return NewLimited(DefaultLimits()) }

// NewLimited returns a store with limits (those left zero take their defaults) and no
// bucket open yet.
func NewLimited(limits Limits) *Store {
	return &Store{limits: limits.orDefaults(), buckets: make(map[string]*blob.Bucket)}
}

// Limits are the store's limits.
func (s *Store) Limits() Limits { return s.limits }

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

func (s *Store) opened(bucketURL string) *blob.Bucket {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buckets[bucketURL]
}

// bucket returns the open bucket of bucketURL, opening it once however many callers
// ask at the same time. A caller waits for the opening as long as its ctx lasts; the
// opening itself runs under its own deadline, so one caller's end fails no other.
func (s *Store) bucket(ctx context.Context, bucketURL string) (*blob.Bucket, error) {
	if b := s.opened(bucketURL); b != nil {
		return b, nil
	}
	done := s.opening.DoChan(bucketURL, func() (any, error) {
		if b := s.opened(bucketURL); b != nil {
			return b, nil
		}
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.limits.CallTimeout)
		defer cancel()
		b, err := blob.OpenBucket(octx, bucketURL)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.buckets[bucketURL] = b
		s.mu.Unlock()
		return b, nil
	})
	select {
	case r := <-done:
		if r.Err != nil {
			return nil, storeError("opening", bucketURL, r.Err)
		}
		return r.Val.(*blob.Bucket), nil
	case <-ctx.Done():
		return nil, storeError("opening", bucketURL, ctx.Err())
	}
}

// Read implements storage.DataStore: at most Limits.MaxDocumentBytes.
func (s *Store) Read(ctx context.Context, uri string) ([]byte, error) {
	bucketURL, key, err := split(uri)
	if err != nil {
		return nil, err
	}
	return s.read(ctx, bucketURL, key, uri)
}

// read reads key in the bucket at bucketURL, within the call deadline and up to the
// document limit; uri names it in errors.
func (s *Store) read(ctx context.Context, bucketURL, key, uri string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.limits.CallTimeout)
	defer cancel()
	r, err := s.openBlob(ctx, bucketURL, key, uri, "reading")
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Close() }()
	data, err := readLimited(r, r.Size(), s.limits.MaxDocumentBytes, uri)
	if err != nil && !errors.Is(err, storage.ErrTooLarge) {
		return nil, storeError("reading", uri, err)
	}
	return data, err
}

// readLimited reads r, of size bytes (-1: unknown), whole if it holds at most limit
// bytes; else it fails at once (a size told) or once it has read limit+1 bytes (a size
// not told, or wrong): never more is held.
func readLimited(r io.Reader, size, limit int64, uri string) ([]byte, error) {
	if size > limit {
		return nil, tooLarge(uri, size, limit, SettingMaxDocumentBytes)
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, tooLarge(uri, -1, limit, SettingMaxDocumentBytes)
	}
	return data, nil
}

// openBlob opens key for reading; the reader lives as long as ctx.
func (s *Store) openBlob(ctx context.Context, bucketURL, key, uri, op string) (*blob.Reader, error) {
	b, err := s.bucket(ctx, bucketURL)
	if err != nil {
		return nil, err
	}
	r, err := b.NewReader(ctx, key, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("datastore: %s %s: %w", op, uri, storage.ErrNotFound)
	}
	if err != nil {
		return nil, storeError(op, uri, err)
	}
	return r, nil
}

// Write implements storage.DataStore.
func (s *Store) Write(ctx context.Context, uri string, content []byte) error {
	bucketURL, key, err := split(uri)
	if err != nil {
		return err
	}
	return s.write(ctx, bucketURL, key, uri, content)
}

func (s *Store) write(ctx context.Context, bucketURL, key, uri string, content []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.limits.CallTimeout)
	defer cancel()
	b, err := s.bucket(ctx, bucketURL)
	if err != nil {
		return err
	}
	if err := b.WriteAll(ctx, key, content, nil); err != nil {
		return storeError("writing", uri, err)
	}
	return nil
}

// Exists implements storage.DataStore.
func (s *Store) Exists(ctx context.Context, uri string) (bool, error) {
	bucketURL, key, err := split(uri)
	if err != nil {
		return false, err
	}
	return s.exists(ctx, bucketURL, key, uri)
}

func (s *Store) exists(ctx context.Context, bucketURL, key, uri string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.limits.CallTimeout)
	defer cancel()
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

// Size implements storage.Sizer.
func (s *Store) Size(ctx context.Context, uri string) (int64, error) {
	bucketURL, key, err := split(uri)
	if err != nil {
		return 0, err
	}
	return s.size(ctx, bucketURL, key, uri)
}

func (s *Store) size(ctx context.Context, bucketURL, key, uri string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.limits.CallTimeout)
	defer cancel()
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

// Copy implements storage.Copier: streamed, at most Limits.MaxCopyBytes, within
// Limits.CopyTimeout.
func (s *Store) Copy(ctx context.Context, from, to string) error {
	fromBucket, fromKey, err := split(from)
	if err != nil {
		return err
	}
	toBucket, toKey, err := split(to)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.limits.CopyTimeout)
	defer cancel()
	r, err := s.openBlob(ctx, fromBucket, fromKey, from, "copying")
	if err != nil {
		return err
	}
	defer func() { _ = r.Close() }()
	w, err := s.createBlob(ctx, toBucket, toKey, to)
	if err != nil {
		return err
	}
	return s.stream(from, to, r, r.Size(), w)
}

// sink is where a copy goes: nothing shows at its URI before commit, and nothing at all
// after abort.
type sink interface {
	io.Writer
	commit() error
	abort()
}

// blobSink writes a blob; cancelling its context before Close abandons the write.
type blobSink struct {
	*blob.Writer
	cancel context.CancelFunc
	uri    string
}

func (w blobSink) commit() error {
	defer w.cancel()
	if err := w.Close(); err != nil {
		return storeError("writing", w.uri, err)
	}
	return nil
}

func (w blobSink) abort() { w.cancel(); _ = w.Close() }

func (s *Store) createBlob(ctx context.Context, bucketURL, key, uri string) (sink, error) {
	b, err := s.bucket(ctx, bucketURL)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w, err := b.NewWriter(ctx, key, nil)
	if err != nil {
		cancel()
		return nil, storeError("writing", uri, err)
	}
	return blobSink{Writer: w, cancel: cancel, uri: uri}, nil
}

// stream copies from r, of size bytes (-1: unknown), to w, up to the copy limit: what
// is over it fails before a byte is copied when its size is told, else once the limit is
// passed, and w is abandoned.
func (s *Store) stream(from, to string, r io.Reader, size int64, w sink) error {
	limit := s.limits.MaxCopyBytes
	if size > limit {
		w.abort()
		return tooLarge(from, size, limit, SettingMaxCopyBytes)
	}
	// A *io.LimitedReader over an *os.File into an *os.File still copies in the
	// kernel (copy_file_range).
	n, err := io.Copy(w, io.LimitReader(r, limit+1))
	switch {
	case err != nil:
		w.abort()
		return storeError("copying", from+" to "+to, err)
	case n > limit:
		w.abort()
		return tooLarge(from, -1, limit, SettingMaxCopyBytes)
	}
	return w.commit()
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
