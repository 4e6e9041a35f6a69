package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/services/postgres"
)

// logBuffer collects a logger's JSON lines, safe to read while the logger writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(b, nil)) }

// waitFor polls cond (a query's answer) until it holds or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

const gadgetsTable = `-- +goose Up
CREATE TABLE gadgets (id bigint PRIMARY KEY, name text NOT NULL);
-- +goose Down
DROP TABLE gadgets;
`

// TestMigrationWaitsForALockWithoutBlockingTraffic: a migration whose lock is held by a
// long transaction gives up after lock_timeout instead of queueing in front of every
// other caller of the table, is rolled back and tried again, and completes once the lock
// is free; a NO TRANSACTION file (an index built concurrently) the same.
func TestMigrationWaitsForALockWithoutBlockingTraffic(t *testing.T) {
	tests := []struct {
		name, file, migration string
		done                  string // a query true once the migration is applied
	}{
		{
			name: "in a transaction", file: "00002_gadget_color.sql",
			migration: "-- +goose Up\nALTER TABLE gadgets ADD COLUMN color text;\n-- +goose Down\nALTER TABLE gadgets DROP COLUMN color;\n",
			done:      "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'gadgets' AND column_name = 'color')",
		},
		{
			name: "no transaction", file: "00002_gadgets_by_name.sql",
			migration: "-- +goose NO TRANSACTION\n-- +goose Up\nDROP INDEX CONCURRENTLY IF EXISTS gadgets_by_name;\n" +
				"CREATE INDEX CONCURRENTLY gadgets_by_name ON gadgets (name);\n-- +goose Down\nDROP INDEX CONCURRENTLY gadgets_by_name;\n",
			done: "SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = 'gadgets_by_name'::regclass AND indisvalid)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			url := pg.NewDatabase(t)
			pool, err := postgres.Open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			first := fstest.MapFS{"00001_gadgets.sql": {Data: []byte(gadgetsTable)}}
			if _, err := postgres.Migrate(ctx, pool, postgres.Migrations{Service: "gadgets", FS: first}, nil); err != nil {
				t.Fatal(err)
			}

			// A long transaction that wrote to the table holds a lock every schema change
			// of it waits for.
			holder, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Close(context.Background()) }()
			var holderPID int
			if err := holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holderPID); err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec(ctx, "BEGIN; INSERT INTO gadgets VALUES (1, 'a')"); err != nil {
				t.Fatal(err)
			}

			const lockTimeout = 200 * time.Millisecond
			var logs logBuffer
			all := fstest.MapFS{"00001_gadgets.sql": first["00001_gadgets.sql"], tt.file: {Data: []byte(tt.migration)}}
			runner := postgres.Runner{LockTimeout: lockTimeout, RetryFor: time.Minute, Log: logs.logger()}
			type result struct {
				n   int
				err error
			}
			migrated := make(chan result, 1)
			go func() {
				n, err := runner.Apply(ctx, pool, postgres.Migrations{Service: "gadgets", FS: all})
				migrated <- result{n, err}
			}()

			// Once the migration waits for the holder's lock, a reader of the table comes:
			// behind a migration that queued without limit it would wait as long as the
			// holder's transaction lasts (here, until it gives up after its own timeout).
			waitFor(ctx, t, "the migration to wait for a lock", func() bool {
				var waiting bool
				err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
					WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> $1)`, holderPID).Scan(&waiting)
				return err == nil && waiting
			})
			reader, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = reader.Close(context.Background()) }()
			if _, err := reader.Exec(ctx, "SET lock_timeout = '5s'"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := reader.Exec(ctx, "SELECT count(*) FROM gadgets"); err != nil {
				t.Fatalf("a reader of the table while the migration waits: %v", err)
			}
			t.Logf("the reader waited %s (lock_timeout %s)", time.Since(start), lockTimeout)

			// The migration keeps trying, each try rolled back and logged with its file.
			waitFor(ctx, t, "a retry to be logged", func() bool {
				return strings.Count(logs.String(), `"file":"`+tt.file+`"`) >= 2
			})
			select {
			case r := <-migrated:
				t.Fatalf("the migration ended while its lock was held: %d, %v", r.n, r.err)
			default:
			}

			if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
			r := <-migrated
			if r.err != nil || r.n != 1 {
				t.Fatalf("Apply = %d, %v; want 1 migration applied once the lock was free\n%s", r.n, r.err, logs.String())
			}
			var done bool
			if err := pool.QueryRow(ctx, tt.done).Scan(&done); err != nil || !done {
				t.Fatalf("%s = %v, %v after the migration", tt.done, done, err)
			}
		})
	}
}

// TestMigrationGivesUpAfterItsRetryTime: a lock that never frees ends the runner's
// tries after RetryFor with an error naming the file, not a wait without end.
func TestMigrationGivesUpAfterItsRetryTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pg.NewDatabase(t)
	pool, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	first := fstest.MapFS{"00001_gadgets.sql": {Data: []byte(gadgetsTable)}}
	if _, err := postgres.Migrate(ctx, pool, postgres.Migrations{Service: "gadgets", FS: first}, nil); err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(context.Background()) }()
	if _, err := holder.Exec(ctx, "BEGIN; LOCK TABLE gadgets IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	all := fstest.MapFS{"00001_gadgets.sql": first["00001_gadgets.sql"],
		"00002_drop.sql": {Data: []byte("-- +goose Up\nALTER TABLE gadgets DROP COLUMN name;\n")}}
	runner := postgres.Runner{LockTimeout: 50 * time.Millisecond, RetryFor: 500 * time.Millisecond}
	_, err = runner.Apply(ctx, pool, postgres.Migrations{Service: "gadgets", FS: all})
	if !errors.Is(err, postgres.ErrLockTimeout) || !strings.Contains(err.Error(), "00002_drop.sql") {
		t.Fatalf("Apply = %v; want ErrLockTimeout naming 00002_drop.sql", err)
	}
}
