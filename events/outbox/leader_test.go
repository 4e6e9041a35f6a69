package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
)

func TestLeadership(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Two replicas: two pools on the same database.
	second := outbox.New(openPool(t, e.url))

	first, err := e.box.TryLead(ctx)
	if err != nil {
		t.Fatalf("TryLead with no leader: %v", err)
	}
	if err := first.Check(ctx); err != nil {
		t.Fatalf("Check of a held leadership: %v", err)
	}
	if _, err := second.TryLead(ctx); !errors.Is(err, outbox.ErrLedElsewhere) {
		t.Fatalf("TryLead while another leads: %v; want ErrLedElsewhere", err)
	}

	// Released, it passes to the other replica at once.
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Check(ctx); err == nil {
		t.Error("Check of a released leadership succeeded")
	}
	next, err := second.TryLead(ctx)
	if err != nil {
		t.Fatalf("TryLead after Release: %v", err)
	}

	// The leader's session dies: its Check fails and another replica takes over.
	pgtest.Exec(t, e.url, fmt.Sprintf("SELECT pg_terminate_backend(%d)", next.PID()))
	if err := next.Check(ctx); err == nil {
		t.Error("Check succeeded after the leader's session was terminated")
	}
	var took *outbox.Leadership
	deadline := time.Now().Add(10 * time.Second)
	for took == nil {
		took, err = e.box.TryLead(ctx)
		if errors.Is(err, outbox.ErrLedElsewhere) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // the server ends the session asynchronously
			continue
		}
		if err != nil {
			t.Fatalf("TryLead after the leader's session died: %v", err)
		}
	}
	if err := took.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = next.Release(ctx) // its connection is dead; this must not hang or panic
}

// TestLeadershipIsTheRelayLeaderLock: TryLead takes postgres.LockRelayLeader, the lock
// v0.1.0's leader took, so that a leader of either release excludes one of the other
// during a rollout.
func TestLeadershipIsTheRelayLeaderLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close(ctx) }()
	if err := postgres.Lock(ctx, other, postgres.LockRelayLeader); err != nil {
		t.Fatal(err)
	}
	if _, err := e.box.TryLead(ctx); !errors.Is(err, outbox.ErrLedElsewhere) {
		t.Fatalf("TryLead while another session holds %s: %v; want ErrLedElsewhere", postgres.LockRelayLeader, err)
	}
	if err := postgres.Unlock(ctx, other, postgres.LockRelayLeader); err != nil {
		t.Fatal(err)
	}
	lead, err := e.box.TryLead(ctx)
	if err != nil {
		t.Fatalf("TryLead once the lock is free: %v", err)
	}
	if ok, err := postgres.TryLock(ctx, other, postgres.LockRelayLeader); err != nil || ok {
		t.Fatalf("TryLock of %s while a relay leads = %v, %v; want false", postgres.LockRelayLeader, ok, err)
	}
	if err := lead.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
