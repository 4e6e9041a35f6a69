package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// The classes of database failure a caller acts on. Classify marks an error with the one
// it belongs to; errors.Is finds the mark. An error of none of these classes, and not the
// context's own, is internal: a bug, a schema that is not the code's, a constraint the
// code should have kept.
var (
	// ErrUnavailable: the database could not be reached or went away (it shut down or
	// restarted, the connection broke mid-call, it takes no more connections). The call
	// may succeed if retried later.
	ErrUnavailable = errors.New("postgres: the database is unavailable")
	// ErrConflict: the transaction conflicted with a concurrent one (a serialization
	// failure or a deadlock) and was rolled back. The call may succeed if retried.
	ErrConflict = errors.New("postgres: the transaction conflicted with a concurrent one")
	// ErrInvalidValue: the database refused a value it cannot hold (a data exception,
	// such as a NUL byte in text or a timestamp out of range). Stores check what they are
	// given first (TextProblem), so this is the last line; the value is the caller's to
	// fix.
	ErrInvalidValue = errors.New("postgres: a value the database cannot hold")
)

// Classify returns err marked with its class (ErrUnavailable, ErrConflict or
// ErrInvalidValue) when it has one. It returns err as it is when err is nil, already
// marked, the context's (errors.Is finds context.Canceled or context.DeadlineExceeded:
// the call was cancelled or ran out of time, whatever the database said about it), or of
// no class (internal). A marked error says what err says and wraps it, so errors.As
// still finds a *pgconn.PgError and the log still shows the database's words; those are
// for the log, not for callers.
func Classify(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConflict) || errors.Is(err, ErrInvalidValue) {
		return err
	}
	if class := classOf(err); class != nil {
		return &classified{class: class, err: err}
	}
	return err
}

// classOf is err's class, or nil when it has none.
func classOf(err error) error {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr):
		switch code := pgErr.Code; {
		case code == pgerrcode.SerializationFailure, code == pgerrcode.DeadlockDetected:
			return ErrConflict
		case pgerrcode.IsDataException(code):
			return ErrInvalidValue
		case pgerrcode.IsConnectionException(code),
			code == pgerrcode.AdminShutdown, code == pgerrcode.CrashShutdown, code == pgerrcode.CannotConnectNow,
			code == pgerrcode.TooManyConnections:
			return ErrUnavailable
		}
		return nil
	case errors.As(err, &connectErr), errors.As(err, &netErr), pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF): // the server went away mid-call
		return ErrUnavailable
	}
	return nil
}

// classified is an error marked with its class: it says what err says, unwraps to err,
// and is the class for errors.Is.
type classified struct {
	class, err error
}

func (e *classified) Error() string { return e.err.Error() }

func (e *classified) Unwrap() error { return e.err }

func (e *classified) Is(target error) bool { return target == e.class }

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
