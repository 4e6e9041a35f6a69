package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/internal/pgtest"
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
