package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flytekube/backend/services/postgres"
)

// classes are what Classify may find an error to be; an error it finds none of is
// internal.
var classes = []struct {
	name string
	err  error
}{
	{"ErrUnavailable", postgres.ErrUnavailable},
	{"ErrConflict", postgres.ErrConflict},
	{"ErrInvalidValue", postgres.ErrInvalidValue},
	{"context.Canceled", context.Canceled},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
}

// checkClass fails t unless Classify(err) is of class want alone (nil: of none, internal),
// and is err in what it says and wraps.
func checkClass(t *testing.T, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatal("no error to classify")
	}
	got := postgres.Classify(err)
	for _, c := range classes {
		if is := errors.Is(got, c.err); is != (c.err == want) {
			t.Errorf("errors.Is(Classify(%v), %s) = %v", err, c.name, is)
		}
	}
	if !errors.Is(got, err) {
		t.Errorf("Classify(%v) does not wrap the error it was given", err)
	}
	if got.Error() != err.Error() {
		t.Errorf("Classify(%v) says %q; want what the error says, for the log", err, got.Error())
	}
	if postgres.Classify(got) != got {
		t.Errorf("Classify(Classify(%v)) marks the error again", err)
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error // nil: internal
	}{
		{"cancelled", fmt.Errorf("store: x: %w", context.Canceled), context.Canceled},
		{"deadline", fmt.Errorf("store: x: %w", context.DeadlineExceeded), context.DeadlineExceeded},
		{"cancelled while the server went away", fmt.Errorf("%w: %w", context.Canceled, io.ErrUnexpectedEOF), context.Canceled},
		{"deadlock", &pgconn.PgError{Code: pgerrcode.DeadlockDetected}, postgres.ErrConflict},
		{"serialization", fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: pgerrcode.SerializationFailure}), postgres.ErrConflict},
		{"connection failure", &pgconn.PgError{Code: pgerrcode.ConnectionFailure}, postgres.ErrUnavailable},
		{"admin shutdown", &pgconn.PgError{Code: pgerrcode.AdminShutdown}, postgres.ErrUnavailable},
		{"too many connections", &pgconn.PgError{Code: pgerrcode.TooManyConnections}, postgres.ErrUnavailable},
		{"unique violation is a bug here", &pgconn.PgError{Code: pgerrcode.UniqueViolation}, nil},
		{"NUL in text", &pgconn.PgError{Code: pgerrcode.CharacterNotInRepertoire}, postgres.ErrInvalidValue},
		{"timestamp out of range", &pgconn.PgError{Code: pgerrcode.DatetimeFieldOverflow}, postgres.ErrInvalidValue},
		{"connection cut mid-call", fmt.Errorf("store: x: %w", io.ErrUnexpectedEOF), postgres.ErrUnavailable},
		{"anything else", errors.New("boom"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkClass(t, tt.err, tt.want) })
	}
	if postgres.Classify(nil) != nil {
		t.Error("Classify(nil) is not nil")
	}
}

func TestClassifyUnreachableDatabase(t *testing.T) {
	_, err := pgconn.Connect(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1")
	checkClass(t, err, postgres.ErrUnavailable)
}

// TestClassifyWhatPostgresSays classifies the failures a real Postgres gives, as pgx
// reports them: the classes are the database's, and a service's edge relies on them.
func TestClassifyWhatPostgresSays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := postgres.Open(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, "CREATE TABLE rows (id bigint PRIMARY KEY, name text NOT NULL); INSERT INTO rows VALUES (1, 'a'), (2, 'b')"); err != nil {
		t.Fatal(err)
	}
	begin := func(t *testing.T, iso pgx.TxIsoLevel) pgx.Tx {
		t.Helper()
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}

	t.Run("NUL in text", func(t *testing.T) {
		_, err := pool.Exec(ctx, "INSERT INTO rows VALUES (3, $1)", "a\x00b")
		checkClass(t, err, postgres.ErrInvalidValue)
	})
	t.Run("number out of range", func(t *testing.T) {
		_, err := pool.Exec(ctx, "SELECT 2147483647::int + 1")
		checkClass(t, err, postgres.ErrInvalidValue)
	})
	t.Run("unique violation", func(t *testing.T) {
		_, err := pool.Exec(ctx, "INSERT INTO rows VALUES (1, 'again')")
		checkClass(t, err, nil)
	})
	t.Run("no such table", func(t *testing.T) {
		_, err := pool.Exec(ctx, "SELECT * FROM no_such_table")
		checkClass(t, err, nil)
	})
	t.Run("serialization failure", func(t *testing.T) {
		tx := begin(t, pgx.RepeatableRead)
		if _, err := tx.Exec(ctx, "SELECT name FROM rows WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "UPDATE rows SET name = 'concurrent' WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		_, err := tx.Exec(ctx, "UPDATE rows SET name = 'late' WHERE id = 1")
		checkClass(t, err, postgres.ErrConflict)
	})
	t.Run("deadlock", func(t *testing.T) {
		a, b := begin(t, pgx.ReadCommitted), begin(t, pgx.ReadCommitted)
		for _, step := range []struct {
			tx pgx.Tx
			id int
		}{{a, 1}, {b, 2}} {
			if _, err := step.tx.Exec(ctx, "UPDATE rows SET name = 'locked' WHERE id = $1", step.id); err != nil {
				t.Fatal(err)
			}
		}
		// Each waits for the row the other holds; Postgres ends one of the two.
		errs := make(chan error, 2)
		go func() { _, err := a.Exec(ctx, "UPDATE rows SET name = 'a' WHERE id = 2"); errs <- err }()
		go func() { _, err := b.Exec(ctx, "UPDATE rows SET name = 'b' WHERE id = 1"); errs <- err }()
		// Both calls must be over before the cleanup rolls their transactions back: the
		// survivor goes on once the victim's locks are gone.
		err, other := <-errs, <-errs
		if err == nil {
			err = other
		}
		checkClass(t, err, postgres.ErrConflict)
	})
	t.Run("connection ended by the server", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		var pid int
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "SELECT 1")
		checkClass(t, err, postgres.ErrUnavailable)
	})
	t.Run("deadline", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := pool.Exec(short, "SELECT pg_sleep(10)")
		checkClass(t, err, context.DeadlineExceeded)
	})
	t.Run("cancelled", func(t *testing.T) {
		cancelled, cancel := context.WithCancel(ctx)
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := pool.Exec(cancelled, "SELECT pg_sleep(10)")
		checkClass(t, err, context.Canceled)
	})
}
