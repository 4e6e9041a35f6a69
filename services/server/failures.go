package server

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
)

// internalFailures answers every call that fails with Internal or Unknown (an error the
// handler did not classify) with a generic Internal message and a reference, and logs
// what the handler returned with the procedure and the same reference: whoever is handed
// the answer finds the log line, and what failed inside (a database's words, table names,
// values) never reaches the caller. Handlers log their other failures themselves,
// since only they know which deserve it.
type internalFailures struct{ log *slog.Logger }

func (f internalFailures) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			return resp, f.answer(ctx, req.Spec(), err)
		}
		return resp, nil
	}
}

func (f internalFailures) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (f internalFailures) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := next(ctx, conn); err != nil {
			return f.answer(ctx, conn.Spec(), err)
		}
		return nil
	}
}

// answer returns err unchanged unless its code is Internal or Unknown; then it logs err
// and returns the generic answer.
func (f internalFailures) answer(ctx context.Context, spec connect.Spec, err error) error {
	code := connect.CodeOf(err)
	if code != connect.CodeInternal && code != connect.CodeUnknown ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err // connect answers the context's errors with their own codes
	}
	level := slog.LevelError
	if errors.Is(ctx.Err(), context.Canceled) {
		// The caller went away, and with it the connection a stream was writing to:
		// nothing failed here.
		level = slog.LevelDebug
	}
	// The reference is the call's trace ID, which finds the trace too, or one made up
	// when the call is not traced.
	attrs := []any{"procedure", spec.Procedure, "code", code.String(), "error", cause(err)}
	ref := trace.SpanContextFromContext(ctx).TraceID()
	if ref.IsValid() {
		attrs = append(attrs, "trace_id", ref.String())
	} else {
		_, _ = rand.Read(ref[:])
	}
	f.log.Log(ctx, level, "call failed", append(attrs, "ref", ref.String())...)
	return connect.NewError(connect.CodeInternal, errors.New("internal error; the service's log has the details under ref "+ref.String()))
}

// cause is what a handler's error says beyond its code: the error a *connect.Error wraps
// (which may log more than it shows: postgres.RPCError's does), or err itself.
func cause(err error) error {
	var connectErr *connect.Error
	if errors.As(err, &connectErr) && connectErr.Unwrap() != nil {
		return connectErr.Unwrap()
	}
	return err
}
