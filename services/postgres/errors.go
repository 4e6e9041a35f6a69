package postgres

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Code classifies a database error for the RPC edge: Unavailable when the database could
// not be reached or went away (the client may retry), Aborted for conflicts worth
// retrying, InvalidArgument for a value the database refuses to hold (such as a NUL byte
// in text; services check their input first, so this is the last line), the context's own
// code when the call was cancelled or timed out, and Internal otherwise.
func Code(err error) connect.Code {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case err == nil:
		return 0
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.As(err, &pgErr):
		switch code := pgErr.Code; {
		case code == pgerrcode.SerializationFailure, code == pgerrcode.DeadlockDetected:
			return connect.CodeAborted
		case pgerrcode.IsDataException(code):
			return connect.CodeInvalidArgument
		case pgerrcode.IsConnectionException(code),
			code == pgerrcode.AdminShutdown, code == pgerrcode.CrashShutdown, code == pgerrcode.CannotConnectNow,
			code == pgerrcode.TooManyConnections:
			return connect.CodeUnavailable
		}
		return connect.CodeInternal
	case errors.As(err, &connectErr), errors.As(err, &netErr), pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF): // the server went away mid-call
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// RPCError turns err into the connect error to answer with: the code Code gives it and a
// message that says what happened in general terms. What the database said (its user,
// host and port, SQLSTATE, constraint, table and column names, the values involved) must
// not reach callers, so err stays only in the error chain (errors.Is and errors.As find
// it), and in what slog logs for the answer's cause.
func RPCError(err error) *connect.Error {
	code := Code(err)
	return connect.NewError(code, &hiddenError{message: publicMessage(code), cause: err})
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

// publicMessage says what a code means for the caller.
func publicMessage(code connect.Code) string {
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

// TextProblem says why Postgres text cannot hold s ("" when it can): text holds neither
// NUL nor invalid UTF-8. Stores check their strings with it before the database does,
// so the caller hears which field is wrong rather than a data exception.
func TextProblem(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte"
	}
	return ""
}
