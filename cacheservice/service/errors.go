package service

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/cacheservice/store"
	"github.com/flytekube/backend/services/server"
)

// storeError turns a store error into the error the caller sees, logging the details: a
// refused value is the caller's to fix, a contended reservation is worth retrying, and
// anything else is answered by server.DatabaseError, which keeps the database's own
// words (its address and user, SQLSTATEs, table names) for the log. An Internal answer
// is logged where the call ends (services/server), under its trace.
func (s *Service) storeError(ctx context.Context, rpc string, err error) error {
	var fieldErr *store.FieldError
	if errors.As(err, &fieldErr) {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	answer := server.DatabaseError(err)
	if errors.Is(err, store.ErrContended) {
		answer = connect.NewError(connect.CodeAborted, errors.New("the call conflicted with concurrent ones; try again"))
	}
	level := slog.LevelWarn
	switch answer.Code() {
	case connect.CodeInternal:
		return answer
	case connect.CodeCanceled:
		level = slog.LevelDebug // the caller went away; nothing is wrong here
	}
	s.log.Log(ctx, level, "cache call failed", "rpc", rpc, "code", answer.Code().String(), "error", err)
	return answer
}
