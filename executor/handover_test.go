package executor_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/executor/eventsink"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// TestNewLeaderDeliversWhatItsPredecessorWrote: an executor that stops (a leader change,
// a crash) may leave history written to an action but not yet delivered. Its successor
// delivers it at its first pass over the action, not at the action's next change of
// phase, which for a task running for hours is hours away: until then the events
// service, the console and every watcher would show the action as Queued.
func TestNewLeaderDeliversWhatItsPredecessorWrote(t *testing.T) {
	svc, eventsClient, restartEvents := restartableEvents(t)
	svc.Stop() // the first executor's deliveries all fail

	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.EventsServiceURL = svc.URL
	var count atomic.Int64
	stopFirst := run(t, cfg, ns, &count)
	actions := createActions(t, 3, func(i int) *flytev1.TaskAction {
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("long-%d", i), Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "handover", ActionName: fmt.Sprintf("long-%d", i),
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/handover", Config: map[string]string{"duration": "1h"}},
		}
	})
	for _, ta := range actions {
		eventually.True(t, time.Minute, func() bool {
			var got flytev1.TaskAction
			return env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got) == nil && got.Status.Phase == flytev1.PhaseRunning
		}, func() string { return ta.Name + " never ran" })
	}
	stopFirst()

	restartEvents()
	run(t, cfg, ns, &count)
	for _, ta := range actions {
		var got flytev1.TaskAction
		stored := 0
		eventually.True(t, 30*time.Second, func() bool {
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil {
				return false
			}
			stored = len(listEvents(t, eventsClient, ta))
			return stored == len(got.Status.PhaseHistory)
		}, func() string {
			return fmt.Sprintf("%s: %d of its %d history entries delivered by the new executor", ta.Name, stored, len(got.Status.PhaseHistory))
		})
		if got.Status.Phase != flytev1.PhaseRunning {
			t.Fatalf("%s is %s; want it still running", ta.Name, got.Status.Phase)
		}
	}
}

// TestDeletionWaitsForDeliveryThroughACrash: whatever an action reported, once it is
// deleted the events service ends up with its end (Aborted for one that was running,
// its outcome for one that had finished), even when the executor that saw the deletion
// dies before it could deliver it. The action's history is the events' only durable
// copy until they are delivered, so the action may not go before: it holds the finalizer
// from its first history entry until its last is delivered. Red before: the first pass
// wrote the status before adding the finalizer and a finished action's finalizer came
// off at once, so a deletion removed the object with the undelivered end only in the
// dying executor's memory (seen in a 30-minute soak: deleted right after Running, the
// events service said RUNNING for good).
func TestDeletionWaitsForDeliveryThroughACrash(t *testing.T) {
	tests := []struct {
		name     string
		duration string
		// finalizerFaults fail the executor's first finalizer patches, holding the
		// action in the moment between its first status write and its finalizer.
		finalizerFaults int
		want            flytecorev1.ActionPhase
	}{
		{"running, deleted before its finalizer landed", "1h", 1000, flytecorev1.ActionPhase_ACTION_PHASE_ABORTED},
		{"running, deleted with its finalizer on", "1h", 0, flytecorev1.ActionPhase_ACTION_PHASE_ABORTED},
		{"finished in one pass, deleted before its outcome was delivered", "0s", 0, flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc, eventsClient, restartEvents := restartableEvents(t)
			ns := env.Namespace(t)
			cfg := testConfig()
			cfg.EventsServiceURL = svc.URL
			restConfig, rec := recordingConfig()
			for range tt.finalizerFaults {
				rec.inject("PATCH taskactions", fault{status: http.StatusInternalServerError})
			}
			if tt.duration == "0s" {
				svc.Stop() // the outcome cannot be delivered before the deletion
			}
			stopFirst, _ := start(t, cfg, ns, runOptions{restConfig: restConfig})
			name := fmt.Sprintf("doomed-%d", i)
			ta := &flytev1.TaskAction{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "crash-" + ns[len(ns)-6:], ActionName: name,
					TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/crash", Config: map[string]string{"duration": tt.duration}},
			}
			createActions(t, 1, func(int) *flytev1.TaskAction { return ta })
			key := client.ObjectKeyFromObject(ta)
			// Wait for what the executor reports (delivered, for the running ones), or
			// for the finalizer patches to have failed while nothing was reported.
			eventually.True(t, time.Minute, func() bool {
				var got flytev1.TaskAction
				if env.Client.Get(context.Background(), key, &got) != nil {
					return false
				}
				if tt.duration == "0s" {
					return got.Status.Phase == flytev1.PhaseSucceeded
				}
				if got.Status.Phase == flytev1.PhaseRunning {
					return actionState(t, eventsClient, ta) == flytecorev1.ActionPhase_ACTION_PHASE_RUNNING
				}
				return tt.finalizerFaults > 0 && rec.count("PATCH taskactions") == 0 && rec.pending("PATCH taskactions") < tt.finalizerFaults-3
			}, func() string { return name + " never reported what the test waits for" })
			if tt.duration != "0s" {
				svc.Stop() // Aborted cannot be delivered before the crash
			}
			if err := env.Client.Delete(context.Background(), ta); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond) // the executor sees the deletion
			stopFirst()

			restartEvents()
			start(t, cfg, ns, runOptions{})
			var state flytecorev1.ActionPhase
			eventually.True(t, time.Minute, func() bool {
				state = actionState(t, eventsClient, ta)
				gone := apierrors.IsNotFound(env.Client.Get(context.Background(), key, &flytev1.TaskAction{}))
				switch {
				case tt.finalizerFaults > 0 && state == flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED:
					return gone // nothing was reported, nothing is owed
				default:
					return gone && state == tt.want
				}
			}, func() string {
				return fmt.Sprintf("%s: the events service says %s; want %s, and the action gone", name, state, tt.want)
			})
		})
	}
}

// TestAnActionDeletedBeforeAnyExecutorSawIt: an action created and deleted while no
// executor runs. With the finalizer put on at admission
// (deploy/kustomize/components/finalizer-at-admission) its deletion waits for an
// executor, which records it Aborted and lets it go. Without the component nothing holds
// it: it is gone before any executor sees it, and the events service never hears of it
// (docs/executor.md: the executor guards what it has seen).
func TestAnActionDeletedBeforeAnyExecutorSawIt(t *testing.T) {
	tests := []struct {
		name      string
		admission bool
		want      flytecorev1.ActionPhase
	}{
		{"the finalizer put on at admission: recorded Aborted", true, flytecorev1.ActionPhase_ACTION_PHASE_ABORTED},
		{"the executor puts it on: never recorded", false, flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc, eventsClient, _ := restartableEvents(t)
			ns := env.Namespace(t)
			if tt.admission {
				remove, err := kubetest.FinalizerAtAdmission(context.Background(), env.Client, ns, controller.Finalizer)
				t.Cleanup(remove)
				if err != nil {
					t.Fatal(err)
				}
			}
			name := fmt.Sprintf("unseen-%d", i)
			ta := &flytev1.TaskAction{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "unseen-" + ns[len(ns)-6:], ActionName: name,
					TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/unseen", Config: map[string]string{"duration": "1h"}},
			}
			createActions(t, 1, func(int) *flytev1.TaskAction { return ta })
			if err := env.Client.Delete(context.Background(), ta); err != nil {
				t.Fatal(err)
			}
			key := client.ObjectKeyFromObject(ta)
			var held flytev1.TaskAction
			err := env.Client.Get(context.Background(), key, &held)
			if tt.admission && (err != nil || held.DeletionTimestamp.IsZero()) {
				t.Fatalf("the deletion did not wait for an executor: %v", err)
			}
			if !tt.admission && !apierrors.IsNotFound(err) {
				t.Fatalf("the action outlived its deletion with no executor to hold it: %v", err)
			}

			cfg := testConfig()
			cfg.EventsServiceURL = svc.URL
			start(t, cfg, ns, runOptions{})
			var state flytecorev1.ActionPhase
			eventually.True(t, time.Minute, func() bool {
				state = actionState(t, eventsClient, ta)
				gone := apierrors.IsNotFound(env.Client.Get(context.Background(), key, &flytev1.TaskAction{}))
				return gone && state == tt.want
			}, func() string {
				return fmt.Sprintf("%s: the events service says %s; want %s, and the action gone", name, state, tt.want)
			})
		})
	}
}

// actionState is the events service's latest phase of an action, UNSPECIFIED if it has
// no record of it (-1 if it did not answer).
func actionState(t *testing.T, c eventsv1connect.EventsServiceClient, ta *flytev1.TaskAction) flytecorev1.ActionPhase {
	t.Helper()
	resp, err := c.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{
		Id: &flytecorev1.ActionIdentifier{Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName},
	}))
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		return flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED
	case err != nil:
		return -1 // matches no phase: the test waits on
	}
	return resp.Msg.GetAction().GetPhase()
}

// restartableEvents runs an events service on a database of its own until the test
// ends, and returns it, a client of it, and how to start it again on its address once
// it is stopped.
func restartableEvents(t *testing.T) (svc *servicetest.Instance, c eventsv1connect.EventsServiceClient, restart func()) {
	t.Helper()
	db := pgtest.New(t).NewDatabase(t)
	run := func(listen string) *servicetest.Instance {
		return servicetest.Run(t, events.Run, events.Config{Listen: listen, DatabaseURL: db, Auth: auth.Config{Mode: auth.ModeNone}})
	}
	svc = run("127.0.0.1:0")
	c, err := eventsink.NewClient(svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(svc.URL, "http://")
	return svc, c, func() { run(addr) }
}
