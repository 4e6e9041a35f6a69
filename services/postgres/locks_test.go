package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
)

// TestLockKeysAreDistinct: no two of the locks the services take share a key, so none
// excludes another by chance.
func TestLockKeysAreDistinct(t *testing.T) {
	names := postgres.LockNames()
	if len(names) != 8 {
		t.Errorf("LockNames() = %q: want the relay's, the partitions', the eviction's, the clusters' keys' and two per service", names)
	}
	seen := map[int64]string{}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			key := postgres.LockKey(name)
			if other, ok := seen[key]; ok {
				t.Errorf("LockKey(%q) = LockKey(%q) = %d", name, other, key)
			}
			seen[key] = name
		})
	}
}

// TestLockKeysOfReleasedLocks: the locks a release took keep its keys, so that its
// replicas and this release's exclude each other during a rollout. v0.1.0's are those
// its code derived (services/postgres.lockID and events/outbox.leaderLockID at 5a96bef);
// v0.2.0's partitions' and eviction's locks were SELECT hashtext(name), read here from
// Postgres itself.
func TestLockKeysOfReleasedLocks(t *testing.T) {
	url := pg.NewDatabase(t)
	hashtext := func(name string) int64 {
		var k int32
		pgtest.QueryRow(t, url, "SELECT hashtext('"+name+"')", &k)
		return int64(k)
	}
	for _, tt := range []struct {
		name string
		key  int64
	}{
		{postgres.MigrationLock(postgres.ServiceEvents), 4913454831584327546},
		{postgres.MigrationLock(postgres.ServiceCache), 5658201965715081050},
		{postgres.LockRelayLeader, 7810340267737656190},
		{postgres.LockEventsPartitions, hashtext(postgres.LockEventsPartitions)},
		{postgres.LockCacheEviction, hashtext(postgres.LockCacheEviction)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := postgres.LockKey(tt.name); got != tt.key {
				t.Errorf("LockKey(%q) = %d; the release took %d", tt.name, got, tt.key)
			}
		})
	}
}

// TestLockExcludesASecondSession: each way of taking a lock keeps another session from
// taking it until it is released, on a real Postgres.
func TestLockExcludesASecondSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pg.NewDatabase(t)
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	first, second := connect(), connect()
	const name = "flyte-test-lock"
	tryLock := func(c *pgx.Conn) bool {
		t.Helper()
		ok, err := postgres.TryLock(ctx, c, name)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	unlock := func(c *pgx.Conn) {
		t.Helper()
		if err := postgres.Unlock(ctx, c, name); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("TryLock", func(t *testing.T) {
		if !tryLock(first) {
			t.Fatal("TryLock of a free lock = false")
		}
		if tryLock(second) {
			t.Fatal("a second session took the lock the first holds")
		}
		if err := postgres.Unlock(ctx, second, name); err == nil {
			t.Fatal("Unlock by a session that does not hold the lock succeeded")
		}
		unlock(first)
		if !tryLock(second) {
			t.Fatal("the second session could not take the lock once the first released it")
		}
		unlock(second)
	})

	t.Run("Lock waits for the holder", func(t *testing.T) {
		if !tryLock(first) {
			t.Fatal("TryLock of a free lock = false")
		}
		took := make(chan error, 1)
		go func() { took <- postgres.Lock(ctx, second, name) }()
		// The second session is seen waiting for the lock, and takes it only once the
		// first lets go.
		observer := connect()
		waitFor(ctx, t, "the second session to wait for the lock", func() bool {
			var waiting bool
			err := observer.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
				WHERE locktype = 'advisory' AND NOT granted AND pid = $1)`, second.PgConn().PID()).Scan(&waiting)
			if err != nil {
				t.Fatal(err)
			}
			return waiting
		})
		select {
		case err := <-took:
			t.Fatalf("Lock returned (%v) while another session held the lock", err)
		default:
		}
		unlock(first)
		if err := <-took; err != nil {
			t.Fatal(err)
		}
		if tryLock(first) {
			t.Fatal("the first session took the lock the second waited for and holds")
		}
		unlock(second)
	})

	t.Run("LockTx holds until the transaction ends", func(t *testing.T) {
		tx, err := first.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := postgres.LockTx(ctx, tx, name); err != nil {
			t.Fatal(err)
		}
		if tryLock(second) {
			t.Fatal("a second session took the lock a transaction holds")
		}
		// With a lock_timeout, a wait for the lock gives up with 55P03, which the
		// migration runner tries again.
		if _, err := second.Exec(ctx, "SET lock_timeout = '50ms'"); err != nil {
			t.Fatal(err)
		}
		var pgErr *pgconn.PgError
		if err := postgres.Lock(ctx, second, name); !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
			t.Fatalf("Lock under lock_timeout while a transaction held the lock: %v; want 55P03", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if !tryLock(second) {
			t.Fatal("the lock was still held after the transaction ended")
		}
		unlock(second)
	})

	t.Run("WithSessionLock", func(t *testing.T) {
		pool, err := postgres.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		ran, err := postgres.WithSessionLock(ctx, pool, name, false, func(*pgx.Conn) error {
			if tryLock(second) {
				t.Error("a second session took the lock while fn ran")
			}
			// A replica's turn while this one's runs is skipped.
			nested, err := postgres.WithSessionLock(ctx, pool, name, false, func(*pgx.Conn) error {
				t.Error("fn ran while another session held the lock")
				return nil
			})
			if nested || err != nil {
				t.Errorf("WithSessionLock while another session held the lock = %v, %v; want false, nil", nested, err)
			}
			return errors.New("fn's failure")
		})
		if !ran || err == nil || err.Error() != "fn's failure" {
			t.Fatalf("WithSessionLock = %v, %v; want true and fn's error", ran, err)
		}
		// Released whatever fn returned.
		if !tryLock(second) {
			t.Fatal("the lock was still held after WithSessionLock returned")
		}
		unlock(second)
	})
}

// TestMigrationsWaitForTheMigrationLock: the runner takes MigrationLock(service), the
// lock v0.1.0's runner took, so that the migrations of replicas of either release run
// one at a time: while another session holds it, nothing is applied; once it is free,
// the waiting runner applies them.
func TestMigrationsWaitForTheMigrationLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pg.NewDatabase(t)
	pool, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(context.Background()) }()
	m := testMigrations()
	if err := postgres.Lock(ctx, holder, postgres.MigrationLock(m.Service)); err != nil {
		t.Fatal(err)
	}

	type result struct {
		n   int
		err error
	}
	migrated := make(chan result, 1)
	go func() {
		n, err := postgres.Migrate(ctx, pool, m, nil)
		migrated <- result{n, err}
	}()
	// The runner is seen trying for the lock: past that, it goes on only once it has it.
	waitFor(ctx, t, "the runner to try for the migration lock", func() bool {
		var trying bool
		err := holder.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE '%pg_try_advisory_lock%')`,
			postgres.MigrationApplicationName(m.Service)).Scan(&trying)
		if err != nil {
			t.Fatal(err)
		}
		return trying
	})
	var applied bool
	if err := holder.QueryRow(ctx, "SELECT to_regclass('widgets') IS NOT NULL").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied {
		t.Fatal("a migration was applied while another session held the migration lock")
	}
	select {
	case r := <-migrated:
		t.Fatalf("Migrate returned (%d, %v) while another session held the migration lock", r.n, r.err)
	default:
	}

	if err := postgres.Unlock(ctx, holder, postgres.MigrationLock(m.Service)); err != nil {
		t.Fatal(err)
	}
	if r := <-migrated; r.err != nil || r.n != 2 {
		t.Fatalf("Migrate once the lock was free = %d, %v; want 2, nil", r.n, r.err)
	}
}
