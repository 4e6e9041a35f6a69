// Package postgres opens the connection pool both services use and applies their
// embedded SQL migrations.
//
// Migrations run under a Postgres advisory lock, so any number of replicas (or a
// migration Job and replicas) can start together: one applies them, the others wait and
// find nothing left to do. Each service keeps its own version table and lock, so
// services sharing a database do not interfere. Runner says how they run: every
// statement waits for a lock no longer than a short lock_timeout, and a migration that
// gave up is rolled back and tried again (migrate.go).
//
// Classify sorts the database's failures into the classes its callers act on
// (ErrUnavailable, ErrConflict, ErrInvalidValue, the context's own, or internal); what a
// class is answered with over RPC is the RPC edge's (services/server.DatabaseError).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/flytekube/backend/internal/backoff"
)

// Option changes how Open sets up the pool.
type Option func(*options)

type options struct{ tracing []otelpgx.Option }

// WithTracerProvider traces the queries to tp instead of the global tracer provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracing = append(o.tracing, otelpgx.WithTracerProvider(tp)) }
}

// Open parses url, creates a pool that traces every query with OpenTelemetry, and waits
// until the database answers or ctx ends, so that a service started beside its database
// does not fail on the first try.
func Open(ctx context.Context, url string, opts ...Option) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("postgres: a database URL is required")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can echo the URL, password included; keep only our words.
		return nil, errors.New("postgres: the database URL is malformed")
	}
	o := options{tracing: []otelpgx.Option{otelpgx.WithTrimSQLInSpanName()}}
	for _, opt := range opts {
		opt(&o)
	}
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(o.tracing...)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: creating pool: %w", err)
	}
	if err := waitReady(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// ready spaces the pings of a database that does not answer yet.
var ready = backoff.Backoff{Base: 100 * time.Millisecond, Cap: 2 * time.Second}

func waitReady(ctx context.Context, pool *pgxpool.Pool) error {
	var err error // the last ping's: the loop's own is only ctx's
	_ = ready.DelayFunc().Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		err = pool.Ping(ctx)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("postgres: database not reachable: %w", err)
	}
	return nil
}

// Migrations names a service's migration set.
type Migrations struct {
	// Service names the owner; it names the version table ("<service>_schema_version")
	// and the advisory lock the migrations run under (MigrationLock).
	Service string
	// FS holds the numbered .sql files (goose format) at its root.
	FS fs.FS
}

// EmbeddedMigrations names the migration set in dir of an embedded file system.
func EmbeddedMigrations(service string, files fs.FS, dir string) Migrations {
	sub, err := fs.Sub(files, dir)
	if err != nil {
		panic(fmt.Sprintf("postgres: migrations of %s: %v", service, err)) // fixed at build time
	}
	return Migrations{Service: service, FS: sub}
}
