package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/services/server"
)

// Each class of database failure (postgres.Classify) is answered with its code and a
// message in general terms.
func TestDatabaseErrorCodes(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		want    connect.Code
		message string
	}{
		{"cancelled", fmt.Errorf("store: x: %w", context.Canceled), connect.CodeCanceled, "the call was cancelled"},
		{"deadline", fmt.Errorf("store: x: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded,
			"the call's deadline passed before the database answered"},
		{"deadlock", &pgconn.PgError{Code: pgerrcode.DeadlockDetected}, connect.CodeAborted, "the call conflicted with another; retry it"},
		{"serialization", fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: pgerrcode.SerializationFailure}), connect.CodeAborted,
			"the call conflicted with another; retry it"},
		{"connection failure", &pgconn.PgError{Code: pgerrcode.ConnectionFailure}, connect.CodeUnavailable, "the database is unavailable; retry later"},
		{"admin shutdown", &pgconn.PgError{Code: pgerrcode.AdminShutdown}, connect.CodeUnavailable, "the database is unavailable; retry later"},
		{"too many connections", &pgconn.PgError{Code: pgerrcode.TooManyConnections}, connect.CodeUnavailable, "the database is unavailable; retry later"},
		{"unique violation is a bug here", &pgconn.PgError{Code: pgerrcode.UniqueViolation}, connect.CodeInternal,
			"internal error; the service's log has the details"},
		{"NUL in text", &pgconn.PgError{Code: pgerrcode.CharacterNotInRepertoire}, connect.CodeInvalidArgument,
			"the request holds a value that cannot be stored"},
		{"timestamp out of range", &pgconn.PgError{Code: pgerrcode.DatetimeFieldOverflow}, connect.CodeInvalidArgument,
			"the request holds a value that cannot be stored"},
		{"connection cut mid-call", fmt.Errorf("store: x: %w", io.ErrUnexpectedEOF), connect.CodeUnavailable, "the database is unavailable; retry later"},
		{"classified already", fmt.Errorf("store: x: %w", postgres.Classify(io.ErrUnexpectedEOF)), connect.CodeUnavailable,
			"the database is unavailable; retry later"},
		{"anything else", errors.New("boom"), connect.CodeInternal, "internal error; the service's log has the details"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := server.DatabaseError(tt.err)
			if got.Code() != tt.want || got.Message() != tt.message {
				t.Fatalf("DatabaseError(%v) = %v %q; want %v %q", tt.err, got.Code(), got.Message(), tt.want, tt.message)
			}
		})
	}
}

func TestDatabaseErrorOfUnreachableDatabase(t *testing.T) {
	_, err := pgconn.Connect(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1")
	if got := server.DatabaseError(err).Code(); got != connect.CodeUnavailable {
		t.Fatalf("DatabaseError(%v) = %v; want Unavailable", err, got)
	}
}

// Answers carry a code and a general message; what the database said (its user, host and
// port, SQLSTATE, constraint and column names) stays in the error chain for the log.
func TestDatabaseErrorKeepsDatabaseDetailsOutOfTheAnswer(t *testing.T) {
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
			got := server.DatabaseError(tt.err)
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
			// What slog logs for the answer's cause is what the database said.
			var logs bytes.Buffer
			slog.New(slog.NewJSONHandler(&logs, nil)).Info("call failed", "error", errors.Unwrap(got))
			var line struct{ Error string }
			if err := json.Unmarshal(logs.Bytes(), &line); err != nil || line.Error != tt.err.Error() {
				t.Errorf("the log line %s shows the cause as %q; want %q", logs.Bytes(), line.Error, tt.err)
			}
		})
	}
}
