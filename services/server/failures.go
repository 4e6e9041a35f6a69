package server

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/flytekube/backend/services/postgres"
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
// (which may log more than it shows: DatabaseError's does), or err itself.
func cause(err error) error {
	var connectErr *connect.Error
	if errors.As(err, &connectErr) && connectErr.Unwrap() != nil {
		return connectErr.Unwrap()
	}
	return err
}

// DatabaseError turns a failed database call into the answer: the code databaseCode gives
// it and a message that says what happened in general terms. What the database said (its
// user, host and port, SQLSTATE, constraint, table and column names, the values involved)
// must not reach callers, so err stays only in the error chain (errors.Is and errors.As
// find it), and in what slog logs for the answer's cause.
func DatabaseError(err error) *connect.Error {
	code := databaseCode(err)
	return connect.NewError(code, &hiddenError{message: databaseMessage(code), cause: err})
}

// databaseCode is the code a failed database call is answered with, from the class
// postgres.Classify finds: Unavailable when the database could not be reached or went
// away (the client may retry), Aborted for a conflict worth retrying, InvalidArgument for
// a value the database refuses to hold, the context's own code when the call was
// cancelled or timed out, and Internal otherwise.
func databaseCode(err error) connect.Code {
	err = postgres.Classify(err)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, postgres.ErrConflict):
		return connect.CodeAborted
	case errors.Is(err, postgres.ErrInvalidValue):
		return connect.CodeInvalidArgument
	case errors.Is(err, postgres.ErrUnavailable):
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// hiddenError shows message and hides cause, which Unwrap still reaches and a log line
// shows.
type hiddenError struct {
	message string
	cause   error
}

func (e *hiddenError) Error() string { return e.message }

func (e *hiddenError) Unwrap() error { return e.cause }

// LogValue is what slog logs for the error: its cause.
func (e *hiddenError) LogValue() slog.Value { return slog.StringValue(e.cause.Error()) }

// databaseMessage says what a code means for the caller of a failed database call.
func databaseMessage(code connect.Code) string {
	switch code {
	case connect.CodeCanceled:
		return "the call was cancelled"
	case connect.CodeDeadlineExceeded:
		return "the call's deadline passed before the database answered"
	case connect.CodeAborted:
		return "the call conflicted with another; retry it"
	case connect.CodeUnavailable:
		return "the database is unavailable; retry later"
	case connect.CodeInvalidArgument:
		return "the request holds a value that cannot be stored"
	}
	return "internal error; the service's log has the details"
}
