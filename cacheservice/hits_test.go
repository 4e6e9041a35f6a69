package cacheservice_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/flytekube/backend/cacheservice/service"
	"github.com/flytekube/backend/cacheservice/store"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
)

// TestHitsHoldAtMostTheirBound: hits of more distinct entries than the bound between two
// flushes are not kept, so a burst of distinct hits cannot grow the service's memory;
// repeated hits of a kept entry stay one, and a flush writes what it kept.
func TestHitsHoldAtMostTheirBound(t *testing.T) {
	dbURL := pg.NewDatabase(t)
	ctx := context.Background()
	pool, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := postgres.Migrate(ctx, pool, store.Migrations(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	keys := make([]store.Key, 3)
	for i := range keys {
		keys[i] = store.KeyOf(key("demo.train", "1", string(rune('a'+i))))
		if _, err := st.Put(ctx, store.PutRequest{Key: keys[i], Source: source("a0"), SourceAttempt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	hits := service.NewHits(2)
	for _, k := range []store.Key{keys[0], keys[0], keys[1], keys[2], keys[2]} {
		hits.Hit(k)
	}
	written, dropped, err := hits.Flush(ctx, st)
	if err != nil || written != 2 || dropped != 2 {
		t.Fatalf("flushed %d, dropped %d, %v; want 2 written (a and b) and 2 dropped (both hits of c)", written, dropped, err)
	}
	var hit int
	pgtest.QueryRow(t, dbURL, "SELECT count(*) FROM cached_outputs WHERE last_hit_at IS NOT NULL", &hit)
	if hit != 2 {
		t.Fatalf("%d entries have a hit recorded; want 2", hit)
	}
	if written, dropped, err := hits.Flush(ctx, st); err != nil || written != 0 || dropped != 0 {
		t.Fatalf("a second flush wrote %d and dropped %d (%v); want nothing", written, dropped, err)
	}
}
