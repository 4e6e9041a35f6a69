package postgres

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"

	"github.com/flytekube/backend/internal/backoff"
)

// ContractMarker, on a line of its own in a migration file, marks a contract migration:
// one after which code older than it no longer works with the schema (it drops or
// narrows what that code uses). Every other migration is an expand: it only adds what
// older code ignores, and older code may run on the schema it leaves, as during a
// rolling upgrade or a rollback.
//
// A contract drops what code stopped using a release or more before it, and that code
// must run beside it while the contract's release rolls out. The marker then says from
// which version on code works with the schema it leaves: "-- +flyte contract: works with
// code from version 16". Without it, only code of the contract's own version does.
const ContractMarker = "-- +flyte contract"

// worksFrom reads the version a contract marker says code works from.
var worksFrom = regexp.MustCompile(`works with code from version (\d+)`)

// ErrSchemaTooNew: the schema was migrated past this program's newest migration by a
// contract migration, so this program (an older release) must not run on it.
var ErrSchemaTooNew = errors.New("the database schema is newer than this program")

// code is what a program's migrations say: its newest version, and its contracts, each
// with the oldest version of code that works with the schema it leaves.
type code struct {
	newest    int64
	contracts map[int64]int64
}

func codeOf(m Migrations) (code, error) {
	c := code{contracts: map[int64]int64{}}
	files, err := fs.Glob(m.FS, "*.sql")
	if err != nil {
		return code{}, fmt.Errorf("postgres: listing %s migrations: %w", m.Service, err)
	}
	for _, file := range files {
		version, err := goose.NumericComponent(file)
		if err != nil {
			return code{}, fmt.Errorf("postgres: %s migration %s: %w", m.Service, file, err)
		}
		c.newest = max(c.newest, version)
		data, err := fs.ReadFile(m.FS, file)
		if err != nil {
			return code{}, fmt.Errorf("postgres: reading %s migration %s: %w", m.Service, file, err)
		}
		lines := bufio.NewScanner(bytes.NewReader(data))
		for lines.Scan() {
			line := strings.TrimSpace(lines.Text())
			if !strings.HasPrefix(line, ContractMarker) {
				continue
			}
			c.contracts[version] = version
			if from := worksFrom.FindStringSubmatch(line); from != nil {
				v, err := strconv.ParseInt(from[1], 10, 64)
				if err != nil || v < 1 || v > version {
					return code{}, fmt.Errorf("postgres: %s migration %s: a contract works with code from a version from 1 to its own, %d; got %q",
						m.Service, file, version, from[1])
				}
				c.contracts[version] = v
			}
		}
	}
	return c, nil
}

// OldestCompatibleCode is the oldest version of code that works with the schema m's
// migrations leave: the highest their contracts say (0, any, without one). A release
// whose newest migration is older than it cannot run beside m's code, nor be upgraded
// to it directly.
func OldestCompatibleCode(m Migrations) (int64, error) {
	c, err := codeOf(m)
	if err != nil {
		return 0, err
	}
	var oldest int64
	for _, from := range c.contracts {
		oldest = max(oldest, from) // as the schema's record only rises (raiseCompatibility)
	}
	return oldest, nil
}

// schema is what the database says of a service's schema: the newest migration applied
// (0 before any), and the oldest version whose code still works with it, when recorded
// (releases before the record have none).
type schema struct {
	version          int64
	oldestCompatible int64
	recorded         bool
}

func versionTable(service string) string       { return service + "_schema_version" }
func compatibilityTable(service string) string { return service + "_schema_compatibility" }

// schemaOf reads the schema's state, creating nothing: a program that only waits for
// its migrations must not write.
func schemaOf(ctx context.Context, pool *pgxpool.Pool, service string) (schema, error) {
	var s schema
	var versions, compat *string
	err := pool.QueryRow(ctx, "SELECT to_regclass($1)::text, to_regclass($2)::text",
		versionTable(service), compatibilityTable(service)).Scan(&versions, &compat)
	if err != nil {
		return s, fmt.Errorf("postgres: reading the %s schema's version: %w", service, err)
	}
	if versions != nil {
		err := pool.QueryRow(ctx, "SELECT coalesce(max(version_id), 0) FROM "+
			pgx.Identifier{versionTable(service)}.Sanitize()+" WHERE is_applied").Scan(&s.version)
		if err != nil {
			return s, fmt.Errorf("postgres: reading the %s schema's version: %w", service, err)
		}
	}
	if compat != nil {
		err := pool.QueryRow(ctx, "SELECT oldest_compatible_version FROM "+
			pgx.Identifier{compatibilityTable(service)}.Sanitize()).Scan(&s.oldestCompatible)
		switch {
		case err == nil:
			s.recorded = true
		case !errors.Is(err, pgx.ErrNoRows):
			return s, fmt.Errorf("postgres: reading the %s schema's compatibility: %w", service, err)
		}
	}
	return s, nil
}

// ensureCompatibility creates the schema's record of the oldest compatible code, as 0
// (any): a schema migrated by releases before the record had no contract migration.
func ensureCompatibility(ctx context.Context, pool *pgxpool.Pool, service string) error {
	table := pgx.Identifier{compatibilityTable(service)}.Sanitize()
	// Under a lock of its own, so that replicas starting together do not race to
	// create the table.
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := LockTx(ctx, tx, CompatibilityLock(service))
		if err == nil {
			_, err = tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+table+` (
				one boolean PRIMARY KEY DEFAULT true CHECK (one),
				oldest_compatible_version bigint NOT NULL)`)
		}
		if err == nil {
			_, err = tx.Exec(ctx, "INSERT INTO "+table+" (oldest_compatible_version) VALUES (0) ON CONFLICT DO NOTHING")
		}
		if err != nil {
			return fmt.Errorf("postgres: recording the %s schema's compatibility: %w", service, err)
		}
		return nil
	})
}

// raiseCompatibility records that code older than version no longer works with the
// schema, before the contract migration of that version is applied.
func raiseCompatibility(ctx context.Context, pool *pgxpool.Pool, service string, version int64) error {
	_, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{compatibilityTable(service)}.Sanitize()+
		" SET oldest_compatible_version = greatest(oldest_compatible_version, $1)", version)
	if err != nil {
		return fmt.Errorf("postgres: raising the %s schema's oldest compatible version to %d: %w", service, version, err)
	}
	return nil
}

// checkNewer decides whether code may run on a schema newer than its migrations: only
// when the schema records that code of its version still works with it.
func (r Runner) checkNewer(m Migrations, s schema, c code) error {
	if s.recorded && c.newest >= s.oldestCompatible {
		r.Log.Warn("the database schema is newer than this program's migrations; it says this program still works with it",
			"migrations", m.Service, "schema_version", s.version, "code_version", c.newest,
			"oldest_compatible_version", s.oldestCompatible)
		return nil
	}
	why, need := "records no version older code works with", s.version
	if s.recorded {
		need = s.oldestCompatible
		why = fmt.Sprintf("works only with code of version %d or later (a contract migration)", s.oldestCompatible)
	}
	return fmt.Errorf("postgres: %w: the %s schema is at version %d and this program's newest migration is version %d; the schema %s: run a release whose migrations reach version %d or later",
		ErrSchemaTooNew, m.Service, s.version, c.newest, why, need)
}

// polls spaces Wait's reads of the schema's version.
var polls = backoff.Backoff{Base: 250 * time.Millisecond, Cap: 5 * time.Second}

// waitLogEvery spaces Wait's reports that it still waits.
const waitLogEvery = 30 * time.Second

// Wait returns once the schema is at the version of m's newest migration, applied by
// another process (the service's migrate command, a Kubernetes Job), logging why it
// waits; it applies nothing. It returns ErrSchemaTooNew at once when the schema is newer
// than m and says that code of m's version no longer works with it.
func (r Runner) Wait(ctx context.Context, pool *pgxpool.Pool, m Migrations) error {
	if m.Service == "" || m.FS == nil {
		return errors.New("postgres: migrations need a service name and files")
	}
	r = r.withDefaults()
	c, err := codeOf(m)
	if err != nil {
		return err
	}
	var lastLog time.Time
	for try := int32(1); ; try++ {
		s, err := schemaOf(ctx, pool, m.Service)
		switch {
		case err != nil && ctx.Err() == nil:
			r.Log.Warn("reading the schema's version failed; trying again", "migrations", m.Service, "error", err)
		case err != nil:
		case s.version > c.newest:
			return r.checkNewer(m, s, c)
		case s.version == c.newest:
			if !lastLog.IsZero() {
				r.Log.Info("the schema is at this program's version", "migrations", m.Service, "schema_version", s.version)
			}
			return nil
		case time.Since(lastLog) >= waitLogEvery:
			lastLog = time.Now()
			r.Log.Info("waiting for the schema to reach this program's version: its migrations are applied by the service's migrate command (in Kubernetes, the migrate Job)",
				"migrations", m.Service, "schema_version", s.version, "code_version", c.newest)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres: waiting for the %s schema to reach version %d: %w", m.Service, c.newest, ctx.Err())
		case <-time.After(polls.Delay(try)):
		}
	}
}
