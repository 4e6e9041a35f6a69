// Package storetest gives tests a blob store that fails on demand: a gocloud.dev/blob
// driver over a real in-memory bucket (memblob) that answers chosen calls with an error
// of a chosen gcerrors code, as a cloud store does in a bad moment. It goes through the
// portable blob type, so the errors reach the data store exactly as a driver's would.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"gocloud.dev/blob"
	"gocloud.dev/blob/driver"
	"gocloud.dev/blob/memblob"
	"gocloud.dev/gcerrors"
)

// Op is a call a fault can answer.
type Op string

// The calls faults can answer; blob's Exists is an Attributes call, ReadAll a range read.
const (
	OpExists Op = "exists"
	OpRead   Op = "read"
	OpWrite  Op = "write"
)

// Faults are the buckets of one URL scheme and the faults they inject.
type Faults struct {
	mu       sync.Mutex
	buckets  map[string]*blob.Bucket // by host: the real buckets, without faults
	rules    []*rule
	injected map[Op]int
}

type rule struct {
	op    Op
	key   string // a substring of the object's key
	code  gcerrors.ErrorCode
	cause error
	times int  // left to inject; negative: forever
	stall bool // block until the call's context ends, as a store that stopped answering
}

// Register serves scheme:// URIs from in-memory buckets (one per host) through blob's
// default URL mux, which the data store opens buckets with. A scheme is registered once
// per process: call it from a package-level variable.
func Register(scheme string) *Faults {
	f := &Faults{buckets: map[string]*blob.Bucket{}, injected: map[Op]int{}}
	blob.DefaultURLMux().RegisterBucket(scheme, f)
	return f
}

// OpenBucketURL implements blob.BucketURLOpener.
func (f *Faults) OpenBucketURL(_ context.Context, u *url.URL) (*blob.Bucket, error) {
	return blob.NewBucket(&bucket{f: f, real: f.Real(u.Host)}), nil
}

// Real is the host's bucket without faults, for a test to put objects in and look.
func (f *Faults) Real(host string) *blob.Bucket {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.buckets[host]
	if !ok {
		b = memblob.OpenBucket(nil)
		f.buckets[host] = b
	}
	return b
}

// Fail answers the next times calls op on an object whose key contains key with an
// error of code (times < 0: every call, until Clear).
func (f *Faults) Fail(op Op, key string, code gcerrors.ErrorCode, times int) {
	f.FailWith(op, key, code, nil, times)
}

// FailWith is Fail with an error the driver saw beneath the code, such as an HTTP
// status, which the portable error wraps as a driver's would.
func (f *Faults) FailWith(op Op, key string, code gcerrors.ErrorCode, cause error, times int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &rule{op: op, key: key, code: code, cause: cause, times: times})
}

// Stall makes the next times calls op on an object whose key contains key block until
// their context ends, as a store that accepted the connection and stopped answering
// (times < 0: every call, until Clear). The call then fails with the context's error.
func (f *Faults) Stall(op Op, key string, times int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &rule{op: op, key: key, times: times, stall: true})
}

// Clear drops every fault not yet injected.
func (f *Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

// Pending is how many faults of rules with a count are still to be injected.
func (f *Faults) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.rules {
		n += max(r.times, 0)
	}
	return n
}

// Injected is how many faults were injected on op.
func (f *Faults) Injected(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.injected[op]
}

// fault is the error for a call that a rule answers, if one does; a stalling rule
// returns it only once ctx has ended.
func (f *Faults) fault(ctx context.Context, op Op, key string) error {
	f.mu.Lock()
	for _, r := range f.rules {
		if r.op != op || !strings.Contains(key, r.key) || r.times == 0 {
			continue
		}
		if r.times > 0 {
			r.times--
		}
		f.injected[op]++
		f.mu.Unlock()
		if r.stall {
			<-ctx.Done()
			return ctx.Err()
		}
		return &Error{Code: r.code, Op: op, Key: key, Cause: r.cause}
	}
	f.mu.Unlock()
	return nil
}

// Error is an injected fault.
type Error struct {
	Code  gcerrors.ErrorCode
	Op    Op
	Key   string
	Cause error
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("storetest: injected %s on %s of %s: %v", e.Code, e.Op, e.Key, e.Cause)
	}
	return fmt.Sprintf("storetest: injected %s on %s of %s", e.Code, e.Op, e.Key)
}

func (e *Error) Unwrap() error { return e.Cause }

// bucket is the driver: faults first, then the real bucket.
type bucket struct {
	f    *Faults
	real *blob.Bucket
}

var errUnimplemented = errors.New("storetest: not implemented")

func (b *bucket) ErrorCode(err error) gcerrors.ErrorCode {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Code
	case errors.Is(err, errUnimplemented):
		return gcerrors.Unimplemented
	}
	return gcerrors.Code(err) // the real bucket's portable error keeps its code
}

func (b *bucket) As(any) bool             { return false }
func (b *bucket) ErrorAs(error, any) bool { return false }
func (b *bucket) Close() error            { return nil } // the real bucket outlives its openers
func (b *bucket) Copy(context.Context, string, string, *driver.CopyOptions) error {
	return errUnimplemented
}
func (b *bucket) Delete(ctx context.Context, key string, _ *driver.DeleteOptions) error {
	return b.real.Delete(ctx, key)
}
func (b *bucket) SignedURL(context.Context, string, *driver.SignedURLOptions) (string, error) {
	return "", errUnimplemented
}
func (b *bucket) ListPaged(context.Context, *driver.ListOptions) (*driver.ListPage, error) {
	return nil, errUnimplemented
}

func (b *bucket) Attributes(ctx context.Context, key string) (*driver.Attributes, error) {
	if err := b.f.fault(ctx, OpExists, key); err != nil {
		return nil, err
	}
	a, err := b.real.Attributes(ctx, key)
	if err != nil {
		return nil, err
	}
	return &driver.Attributes{ContentType: a.ContentType, Metadata: a.Metadata, CreateTime: a.CreateTime,
		ModTime: a.ModTime, Size: a.Size, MD5: a.MD5, ETag: a.ETag}, nil
}

func (b *bucket) NewRangeReader(ctx context.Context, key string, offset, length int64, _ *driver.ReaderOptions) (driver.Reader, error) {
	if err := b.f.fault(ctx, OpRead, key); err != nil {
		return nil, err
	}
	r, err := b.real.NewRangeReader(ctx, key, offset, length, nil)
	if err != nil {
		return nil, err
	}
	return reader{r}, nil
}

func (b *bucket) NewTypedWriter(ctx context.Context, key, contentType string, _ *driver.WriterOptions) (driver.Writer, error) {
	if err := b.f.fault(ctx, OpWrite, key); err != nil {
		return nil, err
	}
	return b.real.NewWriter(ctx, key, &blob.WriterOptions{ContentType: contentType})
}

type reader struct{ r *blob.Reader }

func (r reader) Read(p []byte) (int, error) { return r.r.Read(p) }
func (r reader) Close() error               { return r.r.Close() }
func (r reader) As(any) bool                { return false }
func (r reader) Attributes() *driver.ReaderAttributes {
	return &driver.ReaderAttributes{ContentType: r.r.ContentType(), ModTime: r.r.ModTime(), Size: r.r.Size()}
}
