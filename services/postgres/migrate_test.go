package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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

// migrationSet is a set of numbered files, each adding a column to gadgets; contracts
// are the versions marked as contract migrations.
func migrationSet(newest int, contracts ...int) postgres.Migrations {
	fsys := fstest.MapFS{"00001_gadgets.sql": {Data: []byte(gadgetsTable)}}
	for v := 2; v <= newest; v++ {
		marker := ""
		if slices.Contains(contracts, v) {
			marker = "-- +flyte contract: code before this version no longer works with the schema\n"
		}
		fsys[fmt.Sprintf("%05d_column.sql", v)] = &fstest.MapFile{Data: fmt.Appendf(nil,
			"%s-- +goose Up\nALTER TABLE gadgets ADD COLUMN c%d text;\n", marker, v)}
	}
	return postgres.Migrations{Service: "gadgets", FS: fsys}
}

// TestOlderCodeOnANewerSchema: code whose newest migration is older than the schema
// starts only when the schema says such code still works with it: after expand
// migrations it does, after a contract migration it is refused, naming both versions,
// whether it would apply migrations or wait for them.
func TestOlderCodeOnANewerSchema(t *testing.T) {
	tests := []struct {
		name      string
		schema    postgres.Migrations // applied by the newer code
		code      postgres.Migrations // the older code
		wantError bool
	}{
		{name: "after expand migrations", schema: migrationSet(4), code: migrationSet(2)},
		{name: "after a contract migration", schema: migrationSet(4, 3), code: migrationSet(2), wantError: true},
		{name: "after a contract this code has", schema: migrationSet(4, 3), code: migrationSet(3, 3)},
		{name: "after two contracts", schema: migrationSet(5, 3, 5), code: migrationSet(4, 3), wantError: true},
		// A contract whose drop the code before it had stopped relying on, releases
		// earlier: that code runs beside it (a rolling upgrade), code older still does not.
		{name: "after a contract that says from which code it works", schema: contractFrom(migrationSet(5, 5), 5, 3), code: migrationSet(3)},
		{name: "after a contract, code older than it says", schema: contractFrom(migrationSet(5, 5), 5, 3), code: migrationSet(2), wantError: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pool, err := postgres.Open(ctx, pg.NewDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if _, err := postgres.Migrate(ctx, pool, tt.schema, nil); err != nil {
				t.Fatal(err)
			}
			var schemaVersion, codeVersion int
			for name := range tt.schema.FS.(fstest.MapFS) {
				schemaVersion = max(schemaVersion, versionOf(name))
			}
			for name := range tt.code.FS.(fstest.MapFS) {
				codeVersion = max(codeVersion, versionOf(name))
			}
			for _, mode := range []struct {
				name string
				run  func() error
			}{
				{"apply", func() error { _, err := postgres.Migrate(ctx, pool, tt.code, nil); return err }},
				{"wait", func() error { return postgres.Runner{}.Wait(ctx, pool, tt.code) }},
			} {
				err := mode.run()
				if err != nil {
					t.Logf("%s: %v", mode.name, err)
				}
				switch {
				case !tt.wantError && err != nil:
					t.Errorf("%s: %v; want the older code to start", mode.name, err)
				case tt.wantError && !errors.Is(err, postgres.ErrSchemaTooNew):
					t.Errorf("%s: %v; want ErrSchemaTooNew", mode.name, err)
				case tt.wantError && (!strings.Contains(err.Error(), fmt.Sprint("version ", schemaVersion)) ||
					!strings.Contains(err.Error(), fmt.Sprint("version ", codeVersion))):
					t.Errorf("%s: %q; want both versions, %d and %d, named", mode.name, err, schemaVersion, codeVersion)
				}
			}
		})
	}
}

// contractFrom is m with its contract migration of version marked as working with code
// from version from on.
func contractFrom(m postgres.Migrations, version, from int) postgres.Migrations {
	fsys := m.FS.(fstest.MapFS)
	name := fmt.Sprintf("%05d_column.sql", version)
	fsys[name] = &fstest.MapFile{Data: fmt.Appendf(nil, "-- +flyte contract: works with code from version %d\n-- +goose Up\nALTER TABLE gadgets ADD COLUMN c%d text;\n", from, version)}
	return m
}

func versionOf(file string) int {
	v, _ := strconv.Atoi(file[:5])
	return v
}

// TestWaitForTheSchema: code that waits for its migrations (applied by another
// process) says why it waits, applies nothing itself, and goes on once they are in.
func TestWaitForTheSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := postgres.Open(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, migrationSet(2), nil); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	waited := make(chan error, 1)
	go func() { waited <- postgres.Runner{Log: logs.logger()}.Wait(ctx, pool, migrationSet(3)) }()
	waitFor(ctx, t, "the wait to be logged", func() bool {
		return strings.Contains(logs.String(), `"schema_version":2`) && strings.Contains(logs.String(), `"code_version":3`)
	})
	var applied int
	if err := pool.QueryRow(ctx, "SELECT max(version_id) FROM gadgets_schema_version").Scan(&applied); err != nil || applied != 2 {
		t.Fatalf("while waiting the schema is at %d, %v; want 2: waiting applies nothing", applied, err)
	}
	select {
	case err := <-waited:
		t.Fatalf("Wait returned %v before the schema was at the code's version", err)
	default:
	}
	if _, err := postgres.Migrate(ctx, pool, migrationSet(3), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("Wait once the schema is at the code's version: %v", err)
	}
}

// TestContractRecordedBeforeItIsApplied: the record of the oldest compatible code is
// raised before a contract migration runs, so that older code starting while it runs
// (or after it failed half way) is refused rather than broken; a failed contract leaves
// the schema as it was, which the code before it still matches.
func TestContractRecordedBeforeItIsApplied(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pg.NewDatabase(t)
	pool, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	m := migrationSet(2)
	m.FS.(fstest.MapFS)["00003_contract.sql"] = &fstest.MapFile{Data: []byte(
		"-- +flyte contract\n-- +goose Up\nALTER TABLE gadgets DROP COLUMN c2;\nSELECT 1/0;\n")}
	if _, err := postgres.Migrate(ctx, pool, m, nil); err == nil {
		t.Fatal("a migration that divides by zero was applied")
	}
	var oldest, version int64
	if err := pool.QueryRow(ctx, "SELECT oldest_compatible_version FROM gadgets_schema_compatibility").Scan(&oldest); err != nil || oldest != 3 {
		t.Fatalf("oldest compatible version = %d, %v; want 3, recorded before the contract ran", oldest, err)
	}
	if err := pool.QueryRow(ctx, "SELECT max(version_id) FROM gadgets_schema_version").Scan(&version); err != nil || version != 2 {
		t.Fatalf("schema version = %d, %v; want 2: the failed contract was rolled back", version, err)
	}
	if err := (postgres.Runner{}).Wait(ctx, pool, migrationSet(2)); err != nil {
		t.Fatalf("the code of version 2 on the schema it matches: %v", err)
	}
}

// TestContractWorksFromAVersionItHas: a contract cannot say it works with code newer than
// itself, nor from version 0; such a set of migrations is refused before any is applied.
func TestContractWorksFromAVersionItHas(t *testing.T) {
	for _, from := range []int{0, 4} {
		t.Run(fmt.Sprint("from ", from), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pool, err := postgres.Open(ctx, pg.NewDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			_, err = postgres.Migrate(ctx, pool, contractFrom(migrationSet(3, 3), 3, from), nil)
			if err == nil || !strings.Contains(err.Error(), "a contract works with code from a version from 1 to its own, 3") {
				t.Fatalf("Migrate = %v; want the contract's version range refused", err)
			}
		})
	}
}

// TestOldestCompatibleCode: what the upgrade test reads to know which releases the
// tree still runs beside: the highest version a contract allows, 0 without one.
func TestOldestCompatibleCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    postgres.Migrations
		want int64
	}{
		{name: "expand only", m: migrationSet(5), want: 0},
		{name: "a contract of its own version alone", m: migrationSet(5, 4), want: 4},
		{name: "a contract that works from an earlier version", m: contractFrom(migrationSet(5), 5, 3), want: 3},
		{name: "two contracts: the later raises it", m: contractFrom(migrationSet(6, 3), 6, 4), want: 4},
		{name: "two contracts: an earlier one's own version stays", m: contractFrom(migrationSet(6, 5), 6, 4), want: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := postgres.OldestCompatibleCode(tc.m)
			if err != nil || got != tc.want {
				t.Fatalf("OldestCompatibleCode = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
