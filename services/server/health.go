package server

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"golang.org/x/sync/semaphore"
)

const (
	healthWatchProcedure = "/" + grpchealth.HealthV1ServiceName + "/Watch"
	// healthMaxBytes bounds a health request, which carries only a service name: Check
	// is read before anyone is authenticated.
	healthMaxBytes = 1 << 10
)

var errTooManyWatches = errors.New("too many health watches are open; use Check, or retry later")

// healthHandler serves grpc.health.v1. Check answers anyone, as kubelet probes need, held
// to the read and byte limits. Watch holds a stream open for as long as its caller likes,
// so it answers only callers the middleware lets through, MaxHealthWatches at a time,
// and is ended on shutdown like every other stream.
func (s *Server) healthHandler() (string, http.Handler) {
	path, h := grpchealth.NewHandler(s.health,
		connect.WithInterceptors(watchLimit{s.watches}, streamDrainer{s.draining}),
		connect.WithReadMaxBytes(healthMaxBytes),
		connect.WithRecover(recoverPanic),
	)
	check, watch := s.limit(h), s.guard(h)
	return path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == healthWatchProcedure {
			watch.ServeHTTP(w, r)
			return
		}
		check.ServeHTTP(w, r)
	})
}

// watchLimit refuses a stream when the semaphore has no room left; health's only stream
// is Watch.
type watchLimit struct{ open *semaphore.Weighted }

func (l watchLimit) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (l watchLimit) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (l watchLimit) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !l.open.TryAcquire(1) {
			return connect.NewError(connect.CodeResourceExhausted, errTooManyWatches)
		}
		defer l.open.Release(1)
		return next(ctx, conn)
	}
}
