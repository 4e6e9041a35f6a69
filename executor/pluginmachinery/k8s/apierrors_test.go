package k8s

import (
	"context"
	"errors"
	"io"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

func TestAPIErrorIsTransient(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		name      string
		err       error
		transient bool
	}{
		{"throttled", apierrors.NewTooManyRequests("slow down", 1), true},
		{"internal error", apierrors.NewInternalError(errors.New("etcd")), true},
		{"unavailable", apierrors.NewServiceUnavailable("restarting"), true},
		{"server timeout", apierrors.NewServerTimeout(pods, "create", 1), true},
		{"gateway timeout", apierrors.NewTimeoutError("took too long", 1), true},
		{"bad gateway", apierrors.NewGenericServerResponse(502, "POST", pods, "p", "", 0, true), true},
		{"conflict", apierrors.NewConflict(pods, "p", errors.New("changed")), true},
		{"lost reply", context.DeadlineExceeded, true},
		{"connection refused", syscall.ECONNREFUSED, true},
		{"connection reset", syscall.ECONNRESET, true},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"forbidden", apierrors.NewForbidden(pods, "p", errors.New("no")), false},
		{"invalid", apierrors.NewBadRequest("bad"), false},
		{"not found", apierrors.NewNotFound(pods, "p"), false},
		{"other", errors.New("boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := apiError("creating pod p", tc.err)
			if got := core.IsTransient(err); got != tc.transient {
				t.Fatalf("IsTransient(%v) = %v; want %v", err, got, tc.transient)
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("%v does not wrap %v", err, tc.err)
			}
		})
	}
}
