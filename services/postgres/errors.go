package postgres

import (
	"context"
	"errors"
	"io"
	"net"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgconn"
)

// Code classifies a database error for the RPC edge: Unavailable when the database could
// not be reached or went away (the client may retry), Aborted for conflicts worth
// retrying, the context's own code when the call was cancelled or timed out, and
// Internal otherwise.
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
		switch {
		case pgErr.Code == "40001", pgErr.Code == "40P01": // serialization failure, deadlock
			return connect.CodeAborted
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08", // connection exception
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutting down, cannot connect now
			pgErr.Code == "53300": // too many connections
			return connect.CodeUnavailable
		}
		return connect.CodeInternal
	case errors.As(err, &connectErr), errors.As(err, &netErr), pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF): // the server went away mid-call
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// RPCError wraps err in a connect error with the code Code gives it.
func RPCError(err error) *connect.Error {
	return connect.NewError(Code(err), err)
}
