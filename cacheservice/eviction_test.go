package cacheservice_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/cacheservice"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
)

// TestEvictionKeepsEachProjectWithinItsBound: past a project's bound on entries, or on
// its outputs' size, the least recently used entries go, a hit counting as a use; a
// project within its bound keeps everything.
func TestEvictionKeepsEachProjectWithinItsBound(t *testing.T) {
	dbURL := pg.NewDatabase(t)
	ctx := context.Background()
	// Eviction waits until every entry is written and hit: held meanwhile, so that a
	// pass between two writes (a slow machine) cannot evict before the hits say what was
	// used.
	letEvict := holdEvictionLock(t, dbURL)
	inst := startInstance(t, dbURL, func(c *cacheservice.Config) {
		c.CleanupInterval = 200 * time.Millisecond
		c.ProjectBound = cacheservice.Bound{Entries: 3, OutputBytes: 1 << 40}
		c.ProjectBounds = map[string]cacheservice.Bound{"sized": {Entries: 100, OutputBytes: 1000}}
	})
	keyIn := func(project string, n int) *cachev1.CacheKey {
		k := key("demo.train", "1", fmt.Sprintf("in%d", n))
		k.Project = project
		return k
	}
	putIn := func(project string, n int, bytes uint64) {
		t.Helper()
		k := keyIn(project, n)
		_, err := put(ctx, inst.client, k, fmt.Sprintf("s3://bucket/%s/%d", project, n), func(p *cachev1.PutRequest) {
			p.OutputBytes = bytes
			p.SourceAction.Project = project
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // each written later than the one before
	}
	for n := 1; n <= 5; n++ {
		putIn("counted", n, 0)
	}
	for n := 1; n <= 4; n++ {
		putIn("sized", n, 400)
	}
	for n := 1; n <= 2; n++ {
		putIn("within", n, 0)
	}
	// The first two are hit after all were written: the least recently used are now the
	// third and fourth.
	for _, n := range []int{1, 2} {
		if _, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: keyIn("counted", n)})); err != nil {
			t.Fatal(err)
		}
	}

	letEvict()

	left := func(project string) []string {
		var hashes []string
		pgtest.QueryRow(t, dbURL, fmt.Sprintf("SELECT coalesce(array_agg(inputs_hash ORDER BY inputs_hash), '{}') FROM cached_outputs WHERE project = '%s'", project), &hashes)
		return hashes
	}
	want := map[string][]string{"counted": {"in1", "in2", "in5"}, "sized": {"in3", "in4"}, "within": {"in1", "in2"}}
	eventually.True(t, 10*time.Second, func() bool {
		for project, w := range want {
			if !slices.Equal(left(project), w) {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("entries left: counted %v, sized %v, within %v; want %v", left("counted"), left("sized"), left("within"), want)
	})
	inst.RequireMetrics(t, "flyte_cache_evicted_entries_total 4", "flyte_cache_evicted_bytes_total 800")
}

// TestOneReplicaEvictsAtATime: eviction runs under an advisory lock, so while another
// replica holds it nothing is evicted here; once it lets go, this one evicts.
func TestOneReplicaEvictsAtATime(t *testing.T) {
	dbURL := pg.NewDatabase(t)
	ctx := context.Background()
	letEvict := holdEvictionLock(t, dbURL)
	inst := startInstance(t, dbURL, func(c *cacheservice.Config) {
		c.CleanupInterval = 100 * time.Millisecond
		c.ProjectBound = cacheservice.Bound{Entries: 1, OutputBytes: 1 << 40}
	})
	for n := range 3 {
		if _, err := put(ctx, inst.client, key("demo.train", "1", fmt.Sprintf("e%d", n)), "s3://bucket/out"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // ten passes
	if n, _ := countRows(t, dbURL); n != 3 {
		t.Fatalf("%d entries left while another replica held the lock; want all 3", n)
	}
	letEvict()
	eventually.True(t, 10*time.Second, func() bool { n, _ := countRows(t, dbURL); return n == 1 },
		func() string {
			n, _ := countRows(t, dbURL)
			return fmt.Sprintf("%d entries left once the lock was free; want 1", n)
		})
}

// holdEvictionLock takes the eviction's advisory lock on a session of its own, as
// another replica evicting would, and returns what lets it go.
func holdEvictionLock(t *testing.T, dbURL string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	other, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close(ctx) })
	if err := postgres.Lock(ctx, other, postgres.LockCacheEviction); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := postgres.Unlock(ctx, other, postgres.LockCacheEviction); err != nil {
			t.Fatal(err)
		}
	}
}
