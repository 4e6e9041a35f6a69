package postgres

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Every Postgres advisory lock the services take is named here, and its key is derived
// from its name by LockKey alone, so that two locks meet only if their names are equal
// (TestLockKeysAreDistinct checks the names below). Postgres has one key space for all
// advisory locks of a database, and both services may share one database.
//
// A lock's key must stay as it is from one release to the next while replicas of both
// may run side by side and must exclude each other: an old replica and a new one taking
// different keys for "the same" lock would both hold it. The migration locks and the
// relay's leader lock were in v0.1.0 with these very names and this derivation; the
// partitions' and the eviction's locks were in v0.2.0, keyed by Postgres's hashtext of
// their names, and keep those keys (releasedKeys). TestLockKeysOfReleasedLocks pins
// them all.
const (
	// LockRelayLeader is held, for as long as it leads, by the session of the events
	// replica that relays the outbox (events/outbox). In v0.1.0.
	LockRelayLeader = "flyte-events-relay"
	// LockEventsPartitions is held by the events replica making, or dropping, partitions
	// of action_events (events/store). In v0.2.0, keyed by hashtext.
	LockEventsPartitions = "flyte-events-partitions"
	// LockCacheEviction is held by the cache replica evicting entries over a project's
	// bound (cacheservice/store). In v0.2.0, keyed by hashtext.
	LockCacheEviction = "flyte-cache-eviction"
	// LockEventsClusters is held by the events replica building action_events' key with
	// the cluster on a partition, or giving the previous release's actions their
	// cluster (events/store). After v0.2.0.
	LockEventsClusters = "flyte-events-clusters"
)

// The services whose migrations run here: each names its version table
// ("<service>_schema_version") and its migration locks, so neither may change.
const (
	ServiceEvents = "events"
	ServiceCache  = "cache"
)

// MigrationLock names the lock a service's migrations run under (Runner.Apply). In
// v0.1.0.
func MigrationLock(service string) string { return "flyte-migrations:" + service }

// CompatibilityLock names the transaction-level lock under which a service's record of
// the oldest compatible code is created. After v0.1.0.
func CompatibilityLock(service string) string { return MigrationLock(service) + ":compatibility" }

// LockNames lists every lock the services take, for the test that their keys differ.
func LockNames() []string {
	names := []string{LockRelayLeader, LockEventsPartitions, LockCacheEviction, LockEventsClusters}
	for _, service := range []string{ServiceEvents, ServiceCache} {
		names = append(names, MigrationLock(service), CompatibilityLock(service))
	}
	return names
}

// releasedKeys are the keys a release took for a lock by another derivation than
// LockKey's: v0.2.0's SELECT hashtext(name), which Postgres widens to bigint.
// TestLockKeysOfReleasedLocks checks them against Postgres.
var releasedKeys = map[string]int64{
	LockEventsPartitions: -1816984349,
	LockCacheEviction:    660160974,
}

// LockKey is the advisory lock key of name: the key a release already took for it
// (releasedKeys), else its 64-bit FNV-1a hash shifted right by one so that it is never
// negative, v0.1.0's derivation of its migration and leader locks' keys.
func LockKey(name string) int64 {
	if k, ok := releasedKeys[name]; ok {
		return k
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64() >> 1)
}

// Session is a connection kept for as long as a session-level lock is held on it
// (*pgx.Conn, *pgxpool.Conn): the lock is the session's, so taking it on one pooled
// connection and releasing it on another would leave it held.
type Session interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TryLock takes name's session-level lock if no other session holds it, and says whether
// it did. The session holds it until Unlock or its end.
func TryLock(ctx context.Context, s Session, name string) (bool, error) {
	var ok bool
	if err := s.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", LockKey(name)).Scan(&ok); err != nil {
		return false, fmt.Errorf("postgres: trying the lock %s: %w", name, err)
	}
	return ok, nil
}

// Lock takes name's session-level lock, waiting while another session holds it (no
// longer than the session's lock_timeout, when it has one).
func Lock(ctx context.Context, s Session, name string) error {
	if err := s.QueryRow(ctx, "SELECT 1 FROM pg_advisory_lock($1)", LockKey(name)).Scan(new(int)); err != nil {
		return fmt.Errorf("postgres: taking the lock %s: %w", name, err)
	}
	return nil
}

// Unlock releases name's session-level lock, which the session must hold.
func Unlock(ctx context.Context, s Session, name string) error {
	var ok bool
	if err := s.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", LockKey(name)).Scan(&ok); err != nil {
		return fmt.Errorf("postgres: releasing the lock %s: %w", name, err)
	}
	if !ok {
		return fmt.Errorf("postgres: releasing the lock %s: this session did not hold it", name)
	}
	return nil
}

// LockTx takes name's transaction-level lock, waiting while another session holds it
// (no longer than the lock_timeout); tx's end releases it.
func LockTx(ctx context.Context, tx pgx.Tx, name string) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", LockKey(name)); err != nil {
		return fmt.Errorf("postgres: taking the transaction lock %s: %w", name, err)
	}
	return nil
}

// WithSessionLock runs fn on a connection of pool's holding name's session-level lock,
// and releases the lock after, whatever fn returns. Unless wait, it does not wait for
// another session's turn: ran is false, and fn not run, while another holds the lock.
func WithSessionLock(ctx context.Context, pool *pgxpool.Pool, name string, wait bool, fn func(conn *pgx.Conn) error) (ran bool, err error) {
	pooled, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("postgres: acquiring a connection for the lock %s: %w", name, err)
	}
	defer pooled.Release()
	conn := pooled.Conn()
	if wait {
		err = Lock(ctx, conn, name)
	} else {
		ran, err = TryLock(ctx, conn, name)
	}
	if err != nil || (!wait && !ran) {
		return false, err
	}
	defer func() {
		// A lock left behind on a pooled connection would stop every replica's turn until
		// that connection closed: when the unlock fails, the connection goes, and with it
		// the lock.
		if uerr := Unlock(context.WithoutCancel(ctx), conn, name); uerr != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	return true, fn(conn)
}
