package executor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/eventsink"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// starts counts, per action and attempt, how often test-work began its work.
var starts sync.Map

// workPlugin works for config.workFor, remembering when it began in its plugin state, so
// that a restarted executor continues the work instead of beginning it again.
type workPlugin struct{}

func (workPlugin) GetID() string                  { return "test-work" }
func (workPlugin) GetProperties() core.Properties { return core.Properties{} }
func (workPlugin) Abort(context.Context, core.TaskExecutionContext) error {
	return nil
}
func (workPlugin) Finalize(context.Context, core.TaskExecutionContext) error { return nil }

func (workPlugin) Handle(_ context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	md := tCtx.Metadata()
	var began time.Time
	if _, err := tCtx.PluginStateReader().Get(&began); err != nil {
		return core.Transition{}, err
	}
	if began.IsZero() {
		v, _ := starts.LoadOrStore(fmt.Sprintf("%s/%d", md.Action().Name, md.Attempt()), new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		began = md.Now()
		if err := tCtx.PluginStateWriter().Put(1, began); err != nil {
			return core.Transition{}, err
		}
	}
	workFor, _ := time.ParseDuration(md.Action().Spec.Config["workFor"])
	if left := began.Add(workFor).Sub(md.Now()); left > 0 {
		info := core.PhaseInfoRunning(0, "Working")
		info.RequeueAfter = left
		return core.DoTransition(info), nil
	}
	return core.DoTransition(core.PhaseInfoSuccess("")), nil
}

func workEntry() core.Entry {
	return core.Entry{ID: "test-work", RegisteredTaskTypes: []string{"test-work"},
		LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return workPlugin{}, nil }}
}

// startEventsService runs an events service on a throwaway Postgres until the test ends.
func startEventsService(t *testing.T) *servicetest.Instance {
	t.Helper()
	pg := pgtest.New(t)
	return servicetest.Run(t, events.Run, events.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Auth: auth.Config{Mode: auth.ModeNone}})
}

// TestRestartMidRunLosesNothingAndRunsNothingTwice stops the executor while actions
// work and starts another: every action finishes having begun its work once, and the
// events service has every phase change exactly once.
func TestRestartMidRunLosesNothingAndRunsNothingTwice(t *testing.T) {
	svc := startEventsService(t)

	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.EventsServiceURL = svc.URL
	var count atomic.Int64
	stopFirst := runWith(t, cfg, ns, &count, workEntry())

	const n = 5
	actions := createActions(t, n, func(i int) *flytev1.TaskAction {
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("work-%d", i), Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "restart", ActionName: fmt.Sprintf("work-%d", i),
				TaskName: "demo.work", TaskType: "test-work", RunOutputBase: "mem://out/restart", Config: map[string]string{"workFor": "2s"}},
		}
	})
	for _, ta := range actions {
		waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	}
	stopFirst()
	runWith(t, cfg, ns, &count, workEntry())

	eventsClient, err := eventsink.NewClient(svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ta := range actions {
		got := waitDelivered(t, eventsClient, ta)
		if v, ok := starts.Load(ta.Name + "/1"); !ok || v.(*atomic.Int64).Load() != 1 {
			t.Fatalf("%s began its work %v times; want once", ta.Name, v)
		}
		if got.Status.Attempts != 1 {
			t.Fatalf("%s needed %d attempts; want 1", ta.Name, got.Status.Attempts)
		}
	}
}

func waitPhase(t *testing.T, key client.ObjectKey, phase flytev1.Phase) {
	t.Helper()
	var ta flytev1.TaskAction
	eventually.True(t, time.Minute, func() bool {
		return env.Client.Get(context.Background(), key, &ta) == nil && ta.Status.Phase == phase
	}, func() string { return fmt.Sprintf("%s never reached %s; status %+v", key, phase, ta.Status) })
}

// eventLister is the part of the events service client the tests read with.
type eventLister interface {
	ListActionEvents(context.Context, *connect.Request[eventsv1.ListActionEventsRequest]) (*connect.Response[eventsv1.ListActionEventsResponse], error)
}

// listEvents returns the events the events service holds for ta.
func listEvents(t *testing.T, c eventLister, ta *flytev1.TaskAction) []*eventsv1.ActionEvent {
	t.Helper()
	resp, err := c.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{
		Id: &flytecorev1.ActionIdentifier{Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName},
	}))
	if err != nil {
		t.Fatalf("listing the events of %s: %v", ta.Name, err)
	}
	return resp.Msg.GetEvents()
}

// waitDelivered waits until the action has succeeded and the events service holds each
// of its history entries, and checks that it holds each exactly once.
func waitDelivered(t *testing.T, c eventLister, ta *flytev1.TaskAction) *flytev1.TaskAction {
	t.Helper()
	var got flytev1.TaskAction
	stored := 0
	eventually.True(t, time.Minute, func() bool {
		if env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got) != nil || got.Status.Phase != flytev1.PhaseSucceeded {
			return false
		}
		stored = len(listEvents(t, c, ta))
		return stored >= len(got.Status.PhaseHistory)
	}, func() string {
		return fmt.Sprintf("%s never finished with its events delivered: %d stored; status %+v", ta.Name, stored, got.Status)
	})
	if stored != len(got.Status.PhaseHistory) {
		t.Fatalf("%s: %d events stored; want its %d history entries, once each", ta.Name, stored, len(got.Status.PhaseHistory))
	}
	return &got
}
