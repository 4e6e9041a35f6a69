package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strconv"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/flytekube/backend/internal/backoff"
)

// Defaults of Runner.
const (
	// DefaultLockTimeout is the longest one migration statement waits for a lock. While
	// it waits, every later caller of the same table queues behind it, so this is also
	// the longest a migration stalls the service's traffic by waiting.
	DefaultLockTimeout = 2 * time.Second
	// DefaultRetryFor bounds the time spent trying again migrations that gave up on a
	// lock, so that a lock never freed (a transaction left open) ends in an error.
	DefaultRetryFor = 10 * time.Minute
)

// ErrLockTimeout: a migration gave up on a lock (lock_timeout) on every try within the
// runner's RetryFor. Nothing of the failed file is kept when it runs in a transaction;
// a NO TRANSACTION file keeps the statements before the one that gave up, so such files
// must be written to run again from their start (IF NOT EXISTS, DROP INDEX CONCURRENTLY
// IF EXISTS before CREATE INDEX CONCURRENTLY, batches that skip what is done).
var ErrLockTimeout = errors.New("postgres: a migration waited too long for a lock")

// Runner applies a service's migrations. Its zero value uses the defaults.
type Runner struct {
	// LockTimeout is the lock_timeout of the migration's connection.
	LockTimeout time.Duration
	// RetryFor bounds the time spent trying again after a lock_timeout.
	RetryFor time.Duration
	// Log receives goose's progress and the runner's retries; nil is slog.Default.
	Log *slog.Logger
}

func (r Runner) withDefaults() Runner {
	if r.LockTimeout == 0 {
		r.LockTimeout = DefaultLockTimeout
	}
	if r.RetryFor == 0 {
		r.RetryFor = DefaultRetryFor
	}
	if r.Log == nil {
		r.Log = slog.Default()
	}
	return r
}

// Migrate applies every pending migration with the default Runner and returns how many
// it applied. Running it again, or from several processes at once, is safe.
func Migrate(ctx context.Context, pool *pgxpool.Pool, m Migrations, log *slog.Logger) (int, error) {
	return Runner{Log: log}.Apply(ctx, pool, m)
}

// retries spaces the tries of a migration that gave up on a lock: jittered, so that
// the tries of replicas and a Job do not fall together, and capped near the time a
// caller would notice.
var retries = backoff.Backoff{Base: 250 * time.Millisecond, Cap: 10 * time.Second}

// Apply applies every pending migration under the service's advisory lock, each
// statement on a connection whose lock_timeout is r.LockTimeout, and returns how many it
// applied. A migration that gave up on a lock was rolled back (goose runs each file as
// one transaction), so it is tried again, after a jittered wait, until RetryFor has
// passed. Running it again, or from several processes at once, is safe.
func (r Runner) Apply(ctx context.Context, pool *pgxpool.Pool, m Migrations) (int, error) {
	if m.Service == "" || m.FS == nil {
		return 0, errors.New("postgres: migrations need a service name and files")
	}
	if r.LockTimeout < 0 || r.RetryFor < 0 {
		return 0, errors.New("postgres: a migration's lock timeout and retry time must not be negative")
	}
	r = r.withDefaults()
	mpool, err := r.migrationPool(ctx, pool, m.Service)
	if err != nil {
		return 0, err
	}
	defer mpool.Close()
	db := stdlib.OpenDBFromPool(mpool)
	defer func() { _ = db.Close() }()
	provider, err := r.provider(db, m)
	if err != nil {
		return 0, err
	}

	code, err := codeOf(m)
	if err != nil {
		return 0, err
	}
	state, err := schemaOf(ctx, mpool, m.Service)
	if err != nil {
		return 0, err
	}
	if state.version > code.newest {
		return 0, r.checkNewer(m, state, code)
	}

	deadline := time.Now().Add(r.RetryFor)
	applied := 0
	for try := int32(1); ; try++ {
		n, file, err := r.applyPending(ctx, mpool, provider, m, code)
		applied += n
		if err == nil {
			return applied, nil
		}
		if !isLockTimeout(err) || ctx.Err() != nil {
			return applied, fmt.Errorf("postgres: applying %s migrations: %w", m.Service, err)
		}
		delay := retries.Delay(try)
		if time.Now().Add(delay).After(deadline) {
			return applied, fmt.Errorf("postgres: applying %s migration %s: %w (lock_timeout %s, %d tries in %s): %w",
				m.Service, file, ErrLockTimeout, r.LockTimeout, try, r.RetryFor, err)
		}
		r.Log.Warn("a migration gave up waiting for a lock and was rolled back; trying it again",
			"migrations", m.Service, "file", file, "try", try, "retry_in", delay.String(),
			"lock_timeout", r.LockTimeout.String(), "error", err)
		select {
		case <-ctx.Done():
			return applied, fmt.Errorf("postgres: applying %s migrations: %w", m.Service, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// applyPending applies the migrations the schema lacks, one file at a time: before a
// contract migration it raises the schema's record of the oldest code that works with
// it, so that older code starting meanwhile is refused rather than broken. It returns
// how many it applied and the file that failed.
func (r Runner) applyPending(ctx context.Context, mpool *pgxpool.Pool, provider *goose.Provider, m Migrations, code code) (int, string, error) {
	if err := ensureCompatibility(ctx, mpool, m.Service); err != nil {
		return 0, compatibilityTable(m.Service), err
	}
	state, err := schemaOf(ctx, mpool, m.Service)
	if err != nil {
		return 0, "", err
	}
	applied := 0
	for _, src := range provider.ListSources() {
		if src.Version <= state.version {
			continue
		}
		file := path.Base(src.Path)
		if from, ok := code.contracts[src.Version]; ok {
			if err := raiseCompatibility(ctx, mpool, m.Service, from); err != nil {
				return applied, file, err
			}
			r.Log.Info("a contract migration: code older than it says is refused from now on",
				"migrations", m.Service, "file", file, "oldest_compatible_version", from)
		}
		results, err := provider.UpTo(ctx, src.Version)
		applied += len(results)
		if err != nil {
			var partial *goose.PartialError
			if errors.As(err, &partial) {
				applied += len(partial.Applied)
				file = path.Base(partial.Failed.Source.Path)
			}
			return applied, file, err
		}
	}
	return applied, "", nil
}

// isLockTimeout says whether err is a statement that gave up on a lock (SQLSTATE 55P03).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable
}

// migrationPool is a small pool of pool's database whose connections wait for a lock no
// longer than r.LockTimeout; the service's own connections keep their settings.
func (r Runner) migrationPool(ctx context.Context, pool *pgxpool.Pool, service string) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(r.LockTimeout.Milliseconds(), 1), 10) + "ms"
	// Named in pg_stat_activity, for an operator looking at what holds or waits for a lock.
	cfg.ConnConfig.RuntimeParams["application_name"] = MigrationApplicationName(service)
	// One connection holds the advisory lock and runs the migrations; a second is for
	// the version checks.
	cfg.MaxConns, cfg.MinConns = 2, 0
	mpool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: creating the migration pool: %w", err)
	}
	return mpool, nil
}

// MigrationApplicationName is the application_name of a service's migration connections.
func MigrationApplicationName(service string) string { return service + "-migrations" }

// provider is goose's runner of m on db, under the service's migration lock.
func (r Runner) provider(db *sql.DB, m Migrations) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(LockKey(MigrationLock(m.Service))),
		// Poll every second for up to five minutes: a replica waiting for another's
		// migrations should notice promptly that they are done.
		lock.WithLockTimeout(1, 300),
	)
	if err != nil {
		return nil, fmt.Errorf("postgres: creating migration lock: %w", err)
	}
	store, err := database.NewStore(database.DialectPostgres, m.Service+"_schema_version")
	if err != nil {
		return nil, fmt.Errorf("postgres: creating migration store: %w", err)
	}
	provider, err := goose.NewProvider("", db, m.FS,
		goose.WithStore(store),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(r.Log.With("migrations", m.Service)),
	)
	if err != nil {
		return nil, fmt.Errorf("postgres: loading %s migrations: %w", m.Service, err)
	}
	return provider, nil
}
