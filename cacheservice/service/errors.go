package service

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/cacheservice/store"
	"github.com/flytekube/backend/services/postgres"
)

// answers are what a caller is told for each code a store error can take. The store's
// errors carry the database's own words (its address and user, SQLSTATEs, table
// names), which are for the log, not for whoever can reach the port.
var answers = map[connect.Code]string{
	connect.CodeUnavailable:      "the cache's storage is unavailable; try again later",
	connect.CodeAborted:          "the call conflicted with concurrent ones; try again",
	connect.CodeCanceled:         "the call was cancelled",
	connect.CodeDeadlineExceeded: "the call's deadline passed",
	connect.CodeInternal:         "internal error; the cache service's log has the details",
}

// storeError turns a store error into the error the caller sees, logging the details.
func (s *Service) storeError(ctx context.Context, rpc string, err error) error {
	var fieldErr *store.FieldError
	if errors.As(err, &fieldErr) {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	code := connect.CodeAborted
	if !errors.Is(err, store.ErrContended) {
		code = postgres.Code(err)
	}
	answer, ok := answers[code]
	if !ok {
		code, answer = connect.CodeInternal, answers[connect.CodeInternal]
	}
	level := slog.LevelWarn
	switch code {
	case connect.CodeInternal:
		level = slog.LevelError
	case connect.CodeCanceled:
		level = slog.LevelDebug // the caller went away; nothing is wrong here
	}
	s.log.Log(ctx, level, "cache call failed", "rpc", rpc, "code", code.String(), "error", err)
	return connect.NewError(code, errors.New(answer))
}
