package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgerrcode"
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
		{"deadlock", &pgconn.PgError{Code: pgerrcode.DeadlockDetected}, connect.CodeAborted},
		{"serialization", fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: pgerrcode.SerializationFailure}), connect.CodeAborted},
		{"connection failure", &pgconn.PgError{Code: pgerrcode.ConnectionFailure}, connect.CodeUnavailable},
		{"admin shutdown", &pgconn.PgError{Code: pgerrcode.AdminShutdown}, connect.CodeUnavailable},
		{"too many connections", &pgconn.PgError{Code: pgerrcode.TooManyConnections}, connect.CodeUnavailable},
		{"unique violation is a bug here", &pgconn.PgError{Code: pgerrcode.UniqueViolation}, connect.CodeInternal},
		{"NUL in text", &pgconn.PgError{Code: pgerrcode.CharacterNotInRepertoire}, connect.CodeInvalidArgument},
		{"timestamp out of range", &pgconn.PgError{Code: pgerrcode.DatetimeFieldOverflow}, connect.CodeInvalidArgument},
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

// Answers carry a code and a general message; what the database said (its user, host and
// port, SQLSTATE, constraint and column names) stays in the error chain for the log.
func TestRPCErrorKeepsDatabaseDetailsOutOfTheAnswer(t *testing.T) {
	_, unreachable := pgconn.Connect(context.Background(), "postgres://secret_user:secret_password@127.0.0.1:1/secret_db?connect_timeout=1")
	tests := []struct {
		name    string
		err     error
		want    connect.Code
		secrets []string
	}{
		{"unreachable database", fmt.Errorf("store: reading: %w", unreachable), connect.CodeUnavailable,
			[]string{"secret_user", "secret_password", "secret_db", "127.0.0.1", ":1"}},
		{"constraint violation", fmt.Errorf("store: recording: %w", &pgconn.PgError{
			Severity: "ERROR", Code: pgerrcode.UniqueViolation, Message: `duplicate key value violates unique constraint "action_events_pkey"`,
			Detail: "Key (project)=(tenant-a) already exists.", ConstraintName: "action_events_pkey", TableName: "action_events",
		}), connect.CodeInternal, []string{pgerrcode.UniqueViolation, "SQLSTATE", "action_events", "tenant-a", "duplicate key"}},
		{"NUL in text", fmt.Errorf("store: recording: %w", &pgconn.PgError{
			Severity: "ERROR", Code: pgerrcode.CharacterNotInRepertoire, Message: `invalid byte sequence for encoding "UTF8": 0x00`, ColumnName: "owner_id",
		}), connect.CodeInvalidArgument, []string{pgerrcode.CharacterNotInRepertoire, "SQLSTATE", "UTF8", "0x00", "owner_id"}},
		{"deadlock", &pgconn.PgError{Code: pgerrcode.DeadlockDetected, Message: "deadlock detected", Detail: "Process 4242 waits for ShareLock on transaction 77"},
			connect.CodeAborted, []string{pgerrcode.DeadlockDetected, "4242", "ShareLock"}},
		{"anything else", errors.New("store: decoding action state tenant-a/prod: boom"), connect.CodeInternal, []string{"tenant-a", "boom"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := postgres.RPCError(tt.err)
			if got.Code() != tt.want {
				t.Errorf("code %v; want %v", got.Code(), tt.want)
			}
			if got.Message() == "" {
				t.Error("the answer has no message")
			}
			for _, secret := range tt.secrets {
				if strings.Contains(got.Message(), secret) || strings.Contains(got.Error(), secret) {
					t.Errorf("the answer %q carries %q", got.Message(), secret)
				}
			}
			if !errors.Is(got, tt.err) {
				t.Error("the cause is not in the error chain, so it cannot be logged")
			}
		})
	}
}
