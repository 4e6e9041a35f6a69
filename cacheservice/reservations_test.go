package cacheservice_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flytekube/backend/cacheservice"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
)

func reserve(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner string, heartbeat time.Duration) (*cachev1.GetOrExtendReservationResponse, error) {
	resp, err := c.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
		Key: k, OwnerId: owner, HeartbeatInterval: durationpb.New(heartbeat),
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func release(t *testing.T, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner string) bool {
	t.Helper()
	resp, err := c.ReleaseReservation(context.Background(), connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: k, OwnerId: owner}))
	if err != nil {
		t.Fatalf("ReleaseReservation(%s): %v", owner, err)
	}
	return resp.Msg.GetReleased()
}

func TestExactlyOneConcurrentCallerAcquires(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	const callers = 32
	for round := range 5 {
		k := key("demo.train", "1", fmt.Sprintf("contended-%d", round))
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			expiries = map[time.Time]int{}
			winners  []string
		)
		for c := range callers {
			wg.Go(func() {
				owner := fmt.Sprintf("owner-%d", c)
				res, err := reserve(context.Background(), inst.client, k, owner, 5*time.Second)
				if err != nil {
					t.Errorf("%s: %v", owner, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				expiries[res.GetReservation().GetExpiresAt().AsTime()]++
				if res.GetAcquired() {
					winners = append(winners, owner)
				}
			})
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d callers acquired (%v); want exactly 1", round, len(winners), winners)
		}
		if len(expiries) != 1 {
			t.Fatalf("round %d: callers saw expiries %v; all should see the winner's reservation", round, expiries)
		}
	}
}

func TestReservationLifecycle(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t), func(c *cacheservice.Config) {
		c.MaxHeartbeat = 100 * time.Millisecond
		c.HeartbeatGraceMultiplier = 3
		c.CleanupInterval = time.Hour // keep expired reservations around for the takeover
	})
	ctx := context.Background()
	k := key("demo.train", "1", "inputs-a")

	a, err := reserve(ctx, inst.client, k, "owner-a", time.Hour)
	if err != nil || !a.GetAcquired() {
		t.Fatalf("first reservation: %v, %v", a, err)
	}
	if hb := a.GetReservation().GetHeartbeatInterval().AsDuration(); hb != 100*time.Millisecond {
		t.Fatalf("granted heartbeat %s; want it capped at 100ms", hb)
	}
	if ttl := time.Until(a.GetReservation().GetExpiresAt().AsTime()); ttl > 300*time.Millisecond || ttl < 100*time.Millisecond {
		t.Fatalf("expires in %s; want about 3 heartbeats (300ms)", ttl)
	}

	b, err := reserve(ctx, inst.client, k, "owner-b", 50*time.Millisecond)
	if err != nil || b.GetAcquired() || b.GetReservation().GetOwnerId() != "" || !b.GetReservation().GetExpiresAt().AsTime().Equal(a.GetReservation().GetExpiresAt().AsTime()) {
		t.Fatalf("second owner: %v, %v; want refused with owner-a's expiry but not its owner_id", b, err)
	}

	// The holder extends it, and can keep doing so.
	time.Sleep(50 * time.Millisecond)
	again, err := reserve(ctx, inst.client, k, "owner-a", 100*time.Millisecond)
	if err != nil || !again.GetAcquired() || !again.GetReservation().GetExpiresAt().AsTime().After(a.GetReservation().GetExpiresAt().AsTime()) {
		t.Fatalf("extension: %v, %v; want acquired with a later expiry", again, err)
	}

	// A release by someone else changes nothing.
	if release(t, inst.client, k, "owner-b") {
		t.Fatal("owner-b released owner-a's reservation")
	}
	if b, _ := reserve(ctx, inst.client, k, "owner-b", 50*time.Millisecond); b.GetAcquired() {
		t.Fatal("owner-b acquired after its foreign release")
	}

	// Once the holder stops heartbeating, it expires and another owner takes it over.
	time.Sleep(350 * time.Millisecond)
	b, err = reserve(ctx, inst.client, k, "owner-b", 50*time.Millisecond)
	if err != nil || !b.GetAcquired() || b.GetReservation().GetOwnerId() != "owner-b" {
		t.Fatalf("takeover: %v, %v; want owner-b to hold it", b, err)
	}
	if a, _ := reserve(ctx, inst.client, k, "owner-a", 50*time.Millisecond); a.GetAcquired() {
		t.Fatal("owner-a got its reservation back from a live owner-b")
	}

	if !release(t, inst.client, k, "owner-b") {
		t.Fatal("owner-b could not release its reservation")
	}
	if release(t, inst.client, k, "owner-b") {
		t.Fatal("releasing a missing reservation reported a release")
	}
	if c, err := reserve(ctx, inst.client, k, "owner-c", 50*time.Millisecond); err != nil || !c.GetAcquired() {
		t.Fatalf("after release: %v, %v; want a fresh grant", c, err)
	}

	inst.RequireMetrics(t,
		`flyte_cache_reservations_total{result="granted"} 2`,
		`flyte_cache_reservations_total{result="extended"} 1`,
		`flyte_cache_reservations_total{result="taken_over"} 1`,
		`flyte_cache_reservations_total{result="refused"} 3`,
		`flyte_cache_reservation_releases_total{result="released"} 1`,
		`flyte_cache_reservation_releases_total{result="ignored"} 2`,
	)
}
