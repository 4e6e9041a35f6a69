package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flytekube/backend/services/postgres"
)

// MigrateMode says what a service does with its migrations when it starts.
type MigrateMode string

const (
	// MigrateApply applies pending migrations, then serves: for one process on its own
	// database (make run, docker compose, tests).
	MigrateApply MigrateMode = "apply"
	// MigrateWait applies nothing: it waits, not serving, until the schema is at the
	// version the code needs, applied by the migrate command (a Kubernetes Job), then
	// serves. Either way it refuses a schema that a contract migration made too new for
	// it.
	MigrateWait MigrateMode = "wait"
	// MigrateAndExit applies pending migrations and ends: the migrate command, which a
	// Kubernetes Job runs once per release.
	MigrateAndExit MigrateMode = "apply-and-exit"
	// WaitAndExit waits as MigrateWait does, then ends: for a Kubernetes init container,
	// where a pod waits not ready and no probe kills it.
	WaitAndExit MigrateMode = "wait-and-exit"
)

// Exits says whether the mode ends once the schema is ready, without serving.
func (m MigrateMode) Exits() bool { return m == MigrateAndExit || m == WaitAndExit }

// MigrateConfig says how a service's migrations run.
type MigrateConfig struct {
	// Mode is MigrateApply when empty.
	Mode MigrateMode
	// LockTimeout is the longest one migration statement waits for a lock
	// (postgres.DefaultLockTimeout when 0).
	LockTimeout time.Duration
}

// MigrateFlags registers the flags of a service's migrations.
func MigrateFlags(fs *flag.FlagSet, mc *MigrateConfig) {
	mc.Mode = MigrateApply
	fs.Func("migrate", `what to do with the database's migrations at start: "apply" them, then serve; "wait" until they are applied (by the migrate command, a Kubernetes Job), then serve; "apply-and-exit" (the migrate command) or "wait-and-exit" (an init container) without serving (default "apply")`,
		func(v string) error {
			switch m := MigrateMode(v); m {
			case MigrateApply, MigrateWait, MigrateAndExit, WaitAndExit:
				mc.Mode = m
				return nil
			}
			return errors.New(`want "apply", "wait", "apply-and-exit" or "wait-and-exit"`)
		})
	fs.DurationVar(&mc.LockTimeout, "migration-lock-timeout", postgres.DefaultLockTimeout,
		"longest one migration statement waits for a lock (and so holds the table's traffic behind it) before it is rolled back and tried again")
}

// Migrate applies m's pending migrations to the database at url, or waits for them
// (mode WaitAndExit), and returns: the migrate command of each service, which needs no
// other setting than the database's.
func Migrate(ctx context.Context, url string, m postgres.Migrations, mc MigrateConfig, log *slog.Logger) error {
	if mc.LockTimeout < 0 {
		return errors.New("migration-lock-timeout: must not be negative")
	}
	openCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := postgres.Open(openCtx, url)
	if err != nil {
		return fmt.Errorf("%s migrations: %w", m.Service, err)
	}
	defer pool.Close()
	runner := postgres.Runner{LockTimeout: mc.LockTimeout, Log: log}
	if mc.Mode == WaitAndExit || mc.Mode == MigrateWait {
		if err := runner.Wait(ctx, pool, m); err != nil {
			return err
		}
		log.Info("the schema is at this program's version", "migrations", m.Service)
		return nil
	}
	n, err := runner.Apply(ctx, pool, m)
	if err != nil {
		return err
	}
	log.Info("migrations applied", "migrations", m.Service, "applied", n)
	return nil
}

// prepareSchema applies the migrations or waits for them, as mc says.
func prepareSchema(ctx context.Context, pool *pgxpool.Pool, m postgres.Migrations, mc MigrateConfig, log *slog.Logger) error {
	runner := postgres.Runner{LockTimeout: mc.LockTimeout, Log: log}
	switch mc.Mode {
	case MigrateWait:
		return runner.Wait(ctx, pool, m)
	case "", MigrateApply:
		_, err := runner.Apply(ctx, pool, m)
		return err
	}
	return fmt.Errorf("migrate: %q is not a mode a serving service takes", mc.Mode)
}
