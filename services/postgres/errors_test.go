package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flytekube/backend/services/postgres"
)

func TestCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want connect.Code
	}{
		{"cancelled", fmt.Errorf("store: x: %w", context.Canceled), connect.CodeCanceled},
		{"deadline", fmt.Errorf("store: x: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, connect.CodeAborted},
		{"serialization", fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40001"}), connect.CodeAborted},
		{"connection failure", &pgconn.PgError{Code: "08006"}, connect.CodeUnavailable},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, connect.CodeUnavailable},
		{"too many connections", &pgconn.PgError{Code: "53300"}, connect.CodeUnavailable},
		{"unique violation is a bug here", &pgconn.PgError{Code: "23505"}, connect.CodeInternal},
		{"connection cut mid-call", fmt.Errorf("store: x: %w", io.ErrUnexpectedEOF), connect.CodeUnavailable},
		{"anything else", errors.New("boom"), connect.CodeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := postgres.Code(tt.err); got != tt.want {
				t.Fatalf("Code(%v) = %v; want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestCodeOfUnreachableDatabase(t *testing.T) {
	_, err := pgconn.Connect(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1")
	if got := postgres.Code(err); got != connect.CodeUnavailable {
		t.Fatalf("Code(%v) = %v; want Unavailable", err, got)
	}
}
