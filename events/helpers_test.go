package events_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

// instance is one running events service.
type instance struct {
	*servicetest.Instance
	client eventsv1connect.EventsServiceClient
}

// startInstance runs the service as its main does, on loopback ports.
func startInstance(t *testing.T, dbURL string, mutate ...func(*events.Config)) *instance {
	t.Helper()
	cfg := events.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", DatabaseURL: dbURL, Auth: auth.Config{Mode: auth.ModeNone}}
	inst := servicetest.Run(t, events.Run, cfg, mutate...)
	return &instance{Instance: inst, client: eventsv1connect.NewEventsServiceClient(inst.HTTP, inst.URL, connect.WithGRPC())}
}

// openStore opens a store over a migrated database for direct checks.
func openStore(t *testing.T, dbURL string) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := postgres.Migrate(ctx, pool, store.Migrations(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return store.New(pool), pool
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func actionID(run, action string) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: run, Action: action}
}

// event builds an event of action id; at counts seconds after a fixed epoch.
func event(id *flytecorev1.ActionIdentifier, attempt uint32, phase flytecorev1.ActionPhase, version uint32, at int) *eventsv1.ActionEvent {
	return &eventsv1.ActionEvent{
		Id:         id,
		Attempt:    attempt,
		Phase:      phase,
		Version:    version,
		OccurredAt: timestamppb.New(epoch.Add(time.Duration(at) * time.Second)),
		Reason:     fmt.Sprintf("attempt %d %s v%d", attempt, phase, version),
		TaskType:   "container",
	}
}

const (
	queued      = flytecorev1.ActionPhase_ACTION_PHASE_QUEUED
	waiting     = flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES
	initialized = flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING
	running     = flytecorev1.ActionPhase_ACTION_PHASE_RUNNING
	succeeded   = flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED
	failed      = flytecorev1.ActionPhase_ACTION_PHASE_FAILED
	aborted     = flytecorev1.ActionPhase_ACTION_PHASE_ABORTED
)

func record(t *testing.T, c eventsv1connect.EventsServiceClient, evs ...*eventsv1.ActionEvent) *eventsv1.RecordResponse {
	t.Helper()
	resp, err := c.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: evs}))
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	return resp.Msg
}

func getAction(t *testing.T, c eventsv1connect.EventsServiceClient, id *flytecorev1.ActionIdentifier) *eventsv1.Action {
	t.Helper()
	resp, err := c.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
	if err != nil {
		t.Fatalf("GetAction(%v): %v", id, err)
	}
	return resp.Msg.GetAction()
}

// stateString summarises the parts of an action the fold decides.
func stateString(a *eventsv1.Action) string {
	return fmt.Sprintf("attempt %d %s v%d (%s)", a.GetAttempt(), a.GetPhase(), a.GetVersion(), a.GetReason())
}
