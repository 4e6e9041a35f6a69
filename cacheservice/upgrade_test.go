package cacheservice_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flytekube/backend/cacheservice/store"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/services/postgres"
	releases "github.com/flytekube/backend/test/release"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/servicetest"
)

// startFirstRelease runs v0.1.0's cache service, built from its commit, on the
// database at url (it applies v0.1.0's migrations), until the test ends.
func startFirstRelease(t *testing.T, url string) cachev1connect.CacheServiceClient {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	r, err := releases.Find(root, "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute) // the first build takes minutes
	defer cancel()
	build, err := releases.Get(ctx, root, r)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(build.Binary("cacheservice"), "--listen=127.0.0.1:0", "--metrics-listen=",
		"--auth-mode=none", "--database-url="+url)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "serving" {
				addr <- line.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		return cachev1connect.NewCacheServiceClient(servicetest.H2CClient(), "http://"+a, connect.WithGRPC())
	case <-time.After(time.Minute):
		t.Fatal("v0.1.0's cache service did not start within a minute")
		return nil
	}
}

// blockingLocks lists, for each migration connection waiting for a lock, the locks it
// holds meanwhile on the store's tables in a mode that blocks their reads or writes.
const blockingLocks = `
SELECT w.pid, coalesce(array_agg(h.relation::regclass::text || ' ' || h.mode) FILTER (WHERE h.pid IS NOT NULL), '{}')
FROM pg_locks w
JOIN pg_stat_activity a ON a.pid = w.pid AND a.application_name = $1
LEFT JOIN pg_locks h ON h.pid = w.pid AND h.granted AND h.locktype = 'relation'
    AND h.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
    AND h.relation IN ('cached_outputs'::regclass, 'reservations'::regclass)
WHERE NOT w.granted
GROUP BY w.pid`

// TestMigrationBesideTheFirstRelease: the store's migrations from v0.1.0's schema,
// applied while v0.1.0's cache service serves a populated table, never hold a lock that
// blocks its calls while they wait for another (a transaction open on one table, as
// traffic holds them); its Get, Put and reservations work throughout and after, beside
// the new service, each reading what the other wrote.
func TestMigrationBesideTheFirstRelease(t *testing.T) {
	tests := []struct {
		name   string
		holder string // run in a transaction left open while the migrations wait
	}{
		{"a reader of reservations", "SELECT count(*) FROM reservations"},
		{"a writer of entries", "INSERT INTO cached_outputs SELECT 'held', domain, task_name, cache_version, signature, inputs_hash," +
			" output_uri, source_project, source_domain, source_run, source_action, source_attempt, created_at, updated_at FROM cached_outputs LIMIT 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			url := pg.NewDatabase(t)
			old := startFirstRelease(t, url)
			pool, err := postgres.Open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			_, err = pool.Exec(ctx, `INSERT INTO cached_outputs SELECT 'demo', 'development', 'task' || (i % 100), 'v1', 'sig', 'in' || i,
				's3://bucket/' || i, 'demo', 'development', 'r1', 'a' || i, 1, now(), now() FROM generate_series(1, 20000) i`)
			if err != nil {
				t.Fatal(err)
			}
			before := key("before", "v1", "in1")
			if _, err := put(ctx, old, before, "s3://bucket/before"); err != nil {
				t.Fatalf("v0.1.0 Put before the migrations: %v", err)
			}

			holder, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Close(context.Background()) }()
			if _, err := holder.Exec(ctx, "BEGIN; "+tt.holder); err != nil {
				t.Fatal(err)
			}
			migrated := make(chan error, 1)
			go func() {
				_, err := postgres.Runner{LockTimeout: 200 * time.Millisecond, RetryFor: 5 * time.Minute}.Apply(ctx, pool, store.Migrations())
				migrated <- err
			}()

			// Watch the migrations wait, a few times over; each time, they may hold no
			// lock that blocks the store's traffic.
			for seen := 0; seen < 3; {
				rows, err := pool.Query(ctx, blockingLocks, postgres.MigrationApplicationName("cache"))
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var pid int
					var held []string
					if err := rows.Scan(&pid, &held); err != nil {
						t.Fatal(err)
					}
					seen++
					if len(held) > 0 {
						t.Errorf("a migration waiting for a lock holds %v meanwhile: the service's calls wait with it", held)
					}
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-migrated:
					t.Fatalf("the migrations ended while the holder's transaction was open: %v", err)
				case <-time.After(10 * time.Millisecond):
				}
			}
			during := key("during", "v1", "in1")
			if _, err := put(ctx, old, during, "s3://bucket/during"); err != nil {
				t.Errorf("v0.1.0 Put while the migrations wait: %v", err)
			}
			if _, err := old.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: before})); err != nil {
				t.Errorf("v0.1.0 Get while the migrations wait: %v", err)
			}

			if _, err := holder.Exec(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if err := <-migrated; err != nil {
				t.Fatalf("the migrations once the holder's lock was free: %v", err)
			}

			// The releases side by side, each reading the other's writes.
			cur := startInstance(t, url)
			for i, c := range []struct {
				name         string
				writer, read cachev1connect.CacheServiceClient
			}{{"v0.1.0 then this", old, cur.client}, {"this then v0.1.0", cur.client, old}} {
				k := key("after", "v1", fmt.Sprint("in", i))
				if _, err := put(ctx, c.writer, k, "s3://bucket/after"); err != nil {
					t.Errorf("%s: Put: %v", c.name, err)
					continue
				}
				got, err := c.read.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k}))
				if err != nil || got.Msg.GetOutput().GetOutputUri() != "s3://bucket/after" {
					t.Errorf("%s: Get = %v, %v", c.name, got, err)
				}
				rk := key("reserved", "v1", fmt.Sprint("in", i))
				first, err := c.writer.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
					Key: rk, OwnerId: "first", HeartbeatInterval: durationpb.New(time.Minute)}))
				if err != nil || !first.Msg.GetAcquired() {
					t.Errorf("%s: reserving = %v, %v; want it acquired", c.name, first, err)
				}
				second, err := c.read.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
					Key: rk, OwnerId: "second", HeartbeatInterval: durationpb.New(time.Minute)}))
				if err != nil || second.Msg.GetAcquired() {
					t.Errorf("%s: reserving what the other holds = %v, %v; want it refused", c.name, second, err)
				}
			}
		})
	}
}
