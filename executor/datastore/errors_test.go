package datastore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"

	"gocloud.dev/gcerrors"
	"google.golang.org/api/googleapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/datastore/storetest"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/storage"
)

var faulty = storetest.Register("faulty")

// TestStoreErrorsAreClassified: a store's error keeps its gcerrors code through the data
// store, whichever way it is reached; a missing object is ErrNotFound (Exists: false);
// a store that had a bad moment is transient, so the step is retried without charging
// the action; a refusal that retrying cannot change is neither.
func TestStoreErrorsAreClassified(t *testing.T) {
	ctx := context.Background()
	const uri = "faulty://data/r1/a0/1/outputs.json"
	if err := faulty.Real("data").WriteAll(ctx, "r1/a0/1/outputs.json", []byte(`{"y": 1}`), nil); err != nil {
		t.Fatal(err)
	}
	confined, err := datastore.Confine(datastore.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "faulty://data/r1"}}
	stores := map[string]storage.DataStore{"store": datastore.New(), "action's view": confined.ForAction(ta)}

	type want int
	const (
		notFound want = iota
		transient
		permanent
	)
	// gcerrors has no Unavailable: the s3 and gcs drivers report a 503, a 500 or a reset
	// connection as Unknown, so beneath Unknown the driver's own error decides.
	tests := []struct {
		name  string
		code  gcerrors.ErrorCode
		cause error
		want  want
	}{
		{"not found", gcerrors.NotFound, nil, notFound},
		{"deadline exceeded", gcerrors.DeadlineExceeded, nil, transient},
		{"resource exhausted", gcerrors.ResourceExhausted, nil, transient},
		{"internal", gcerrors.Internal, nil, transient},
		{"canceled", gcerrors.Canceled, nil, transient},
		{"unknown: HTTP 503", gcerrors.Unknown, httpStatus(http.StatusServiceUnavailable), transient},
		{"unknown: HTTP 500", gcerrors.Unknown, httpStatus(http.StatusInternalServerError), transient},
		{"unknown: HTTP 429", gcerrors.Unknown, httpStatus(http.StatusTooManyRequests), transient},
		{"unknown: gRPC unavailable", gcerrors.Unknown, status.Error(codes.Unavailable, "connection refused"), transient},
		{"unknown: GCS JSON API 503", gcerrors.Unknown, &googleapi.Error{Code: http.StatusServiceUnavailable, Message: "Backend Error"}, transient},
		{"unknown: GCS JSON API 502", gcerrors.Unknown, &googleapi.Error{Code: http.StatusBadGateway}, transient},
		{"unknown: GCS JSON API 408", gcerrors.Unknown, &googleapi.Error{Code: http.StatusRequestTimeout}, transient},
		{"unknown: GCS JSON API 400", gcerrors.Unknown, &googleapi.Error{Code: http.StatusBadRequest, Message: "Invalid"}, permanent},
		{"unknown: connection reset", gcerrors.Unknown, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, transient},
		{"unknown: body cut short", gcerrors.Unknown, io.ErrUnexpectedEOF, transient},
		{"permission denied", gcerrors.PermissionDenied, nil, permanent},
		{"invalid argument", gcerrors.InvalidArgument, nil, permanent},
		{"failed precondition", gcerrors.FailedPrecondition, nil, permanent},
		{"unknown", gcerrors.Unknown, nil, permanent},
		{"unknown: HTTP 400", gcerrors.Unknown, httpStatus(http.StatusBadRequest), permanent},
		{"unknown: gRPC permission denied", gcerrors.Unknown, status.Error(codes.PermissionDenied, "no"), permanent},
	}
	for name, store := range stores {
		for _, tt := range tests {
			for _, op := range []storetest.Op{storetest.OpExists, storetest.OpRead, storetest.OpWrite} {
				t.Run(fmt.Sprintf("%s/%s/%s", name, op, tt.name), func(t *testing.T) {
					faulty.FailWith(op, "outputs.json", tt.code, tt.cause, 1)
					t.Cleanup(faulty.Clear)
					var ok bool
					var err error
					switch op {
					case storetest.OpExists:
						ok, err = store.Exists(ctx, uri)
					case storetest.OpRead:
						_, err = store.Read(ctx, uri)
					case storetest.OpWrite:
						err = store.Write(ctx, uri, []byte(`{"y": 1}`))
					}
					if faulty.Pending() != 0 {
						t.Fatal("the fault was not injected")
					}
					switch {
					case tt.want == notFound && op == storetest.OpExists:
						if err != nil || ok {
							t.Fatalf("Exists = %v, %v; want false, nil", ok, err)
						}
						return
					case tt.want == notFound && op == storetest.OpRead:
						if !errors.Is(err, storage.ErrNotFound) {
							t.Fatalf("Read: %v; want ErrNotFound", err)
						}
						return
					case err == nil:
						t.Fatalf("%s succeeded on a %s error (exists: %v)", op, tt.name, ok)
					}
					if got := gcerrors.Code(err); got != tt.code {
						t.Errorf("code %s; want %s kept (error: %v)", got, tt.code, err)
					}
					if core.IsTransient(err) != (tt.want == transient) {
						t.Errorf("transient: %v; want %v (error: %v)", core.IsTransient(err), tt.want == transient, err)
					}
					if errors.Is(err, storage.ErrNotFound) {
						t.Errorf("a %s error reads as not found: %v", tt.name, err)
					}
				})
			}
		}
	}
}

// httpStatus is a driver's error that carries the HTTP status of the reply, as the AWS
// SDK's ResponseError does.
type httpStatus int

func (h httpStatus) Error() string       { return fmt.Sprintf("HTTP %d", int(h)) }
func (h httpStatus) HTTPStatusCode() int { return int(h) }
