package cacheservice_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flytekube/backend/cacheservice"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
)

func TestInvalidRequestsAreRejectedAndWriteNothing(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	c := inst.client
	ctx := context.Background()
	withKey := func(mutate func(*cachev1.CacheKey)) *cachev1.CacheKey {
		k := key("demo.train", "1", "inputs-a")
		mutate(k)
		return k
	}
	reserveWith := func(owner string, hb *durationpb.Duration) error {
		_, err := c.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
			Key: key("demo.train", "1", "inputs-a"), OwnerId: owner, HeartbeatInterval: hb,
		}))
		return err
	}
	tests := []refusal{
		{"Get without a key", func() error { _, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{})); return err }, "key"},
		{"empty task name", func() error {
			_, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: withKey(func(k *cachev1.CacheKey) { k.TaskName = "" })}))
			return err
		}, "key.task_name"},
		{"project not a DNS label", func() error {
			_, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: withKey(func(k *cachev1.CacheKey) { k.Project = "My Project" })}))
			return err
		}, "key.project"},
		{"signature too long", func() error {
			_, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: withKey(func(k *cachev1.CacheKey) { k.Signature = strings.Repeat("a", 129) })}))
			return err
		}, "key.signature"},
		{"inputs hash with spaces", func() error {
			_, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: withKey(func(k *cachev1.CacheKey) { k.InputsHash = "a b" })}))
			return err
		}, "key.inputs_hash"},
		{"negative max age", func() error {
			_, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: key("demo.train", "1", "x"), MaxAge: durationpb.New(-time.Second)}))
			return err
		}, "max_age"},
		{"Put output that is not a URI", func() error {
			_, err := put(ctx, c, key("demo.train", "1", "x"), "not a uri")
			return err
		}, "output_uri"},
		{"Put without a source", func() error {
			_, err := put(ctx, c, key("demo.train", "1", "x"), "s3://b/o", func(r *cachev1.PutRequest) { r.SourceAction = nil })
			return err
		}, "source_action"},
		{"Put with attempt 0", func() error {
			_, err := put(ctx, c, key("demo.train", "1", "x"), "s3://b/o", func(r *cachev1.PutRequest) { r.SourceAttempt = 0 })
			return err
		}, "source_attempt"},
		{"reservation without owner", func() error { return reserveWith("", durationpb.New(time.Second)) }, "owner_id"},
		{"reservation without heartbeat", func() error { return reserveWith("o", nil) }, "heartbeat_interval"},
		{"zero heartbeat", func() error { return reserveWith("o", durationpb.New(0)) }, "heartbeat_interval"},
		{"negative heartbeat", func() error { return reserveWith("o", durationpb.New(-time.Second)) }, "heartbeat_interval"},
		{"heartbeat over an hour", func() error { return reserveWith("o", durationpb.New(2*time.Hour)) }, "heartbeat_interval"},
		{"release without owner", func() error {
			_, err := c.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: key("demo.train", "1", "x")}))
			return err
		}, "owner_id"},
		{"invalidate without task", func() error {
			_, err := c.Invalidate(ctx, connect.NewRequest(&cachev1.InvalidateRequest{Project: "demo", Domain: "development"}))
			return err
		}, "task_name"},
	}
	requireRefused(t, tests)
	requireNothingStored(t, db)
}

// TestSurvivesPostgresRestart stops Postgres under a running service: calls fail with
// Unavailable meanwhile and succeed again once it is back, without restarting the service.
func TestSurvivesPostgresRestart(t *testing.T) {
	own := pgtest.New(t) // its own cluster: the shared one must stay up for other tests
	inst := startInstance(t, own.NewDatabase(t))
	ctx := context.Background()
	k := key("demo.train", "1", "inputs-a")
	if _, err := put(ctx, inst.client, k, "s3://b/o"); err != nil {
		t.Fatal(err)
	}

	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Get": func() error {
			_, err := inst.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k}))
			return err
		},
		"Put": func() error {
			_, err := put(ctx, inst.client, key("demo.train", "1", "inputs-b"), "s3://b/o")
			return err
		},
		"GetOrExtendReservation": func() error {
			_, err := reserve(ctx, inst.client, k, "owner-a", time.Second)
			return err
		},
	}
	for name, call := range calls {
		if err := call(); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("%s during the outage: %v; want Unavailable", name, err)
		}
	}

	if err := own.Resume(); err != nil {
		t.Fatal(err)
	}
	for name, call := range calls {
		var err error
		eventually.True(t, 30*time.Second, func() bool {
			if err = call(); err != nil && connect.CodeOf(err) != connect.CodeUnavailable {
				t.Fatalf("%s after Postgres came back: %v", name, err)
			}
			return err == nil
		}, func() string { return fmt.Sprintf("%s after Postgres came back: %v", name, err) })
	}
}

func TestCleanupRemovesExpiredReservationsAndOldEntries(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db, func(c *cacheservice.Config) {
		c.MaxHeartbeat = 20 * time.Millisecond
		c.HeartbeatGraceMultiplier = 1
		c.EntryTTL = 200 * time.Millisecond
		c.CleanupInterval = 20 * time.Millisecond
		c.CleanupBatch = 2 // several batches per pass
	})
	ctx := context.Background()
	for i := range 5 {
		k := key("demo.train", "1", "in"+string(rune('a'+i)))
		if _, err := put(ctx, inst.client, k, "s3://b/o"); err != nil {
			t.Fatal(err)
		}
		if _, err := reserve(ctx, inst.client, k, "owner", time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var entries, reservations int
	eventually.True(t, 30*time.Second, func() bool {
		entries, reservations = countRows(t, db)
		return entries == 0 && reservations == 0
	}, func() string {
		return fmt.Sprintf("cleanup left %d entries and %d reservations", entries, reservations)
	})
	// The pass counts what it deleted once its transaction has committed: the rows are
	// gone a moment before the counter moves.
	for _, sample := range []string{`flyte_cache_cleanup_deleted_total{kind="entry"} 5`, `flyte_cache_cleanup_deleted_total{kind="reservation"} 5`} {
		if !inst.WaitForMetric(t, sample) {
			inst.RequireMetrics(t, sample)
		}
	}
}
