package k8s

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// apiError wraps an API server error with what was being done, marking it transient when
// it is about the API server and not the request: throttling (429), a server error
// (5xx), a timeout, a conflict with a concurrent write, or a broken connection. Those
// are retried after a backoff without counting against the action.
func apiError(what string, err error) error {
	wrapped := fmt.Errorf("%s: %w", what, err)
	if isTransient(err) {
		return core.Transient(wrapped)
	}
	return wrapped
}

func isTransient(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == http.StatusTooManyRequests || code >= http.StatusInternalServerError ||
			apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err)
	}
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) ||
		utilnet.IsConnectionReset(err) || utilnet.IsConnectionRefused(err) || utilnet.IsProbableEOF(err)
}
