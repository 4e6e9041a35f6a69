package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// storedEvents lists all of an action's events, page by page.
func storedEvents(t *testing.T, ta *flytev1.TaskAction) []*eventsv1.ActionEvent {
	t.Helper()
	var evs []*eventsv1.ActionEvent
	token := ""
	for {
		resp, err := eventsSvc.client().ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{
			Id:        &flytecorev1.ActionIdentifier{Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName},
			PageToken: token,
		}))
		if err != nil {
			t.Fatalf("listing events of %s: %v", ta.Name, err)
		}
		evs = append(evs, resp.Msg.GetEvents()...)
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return evs
		}
	}
}

// delivered: finished, with its whole history delivered as the publisher knows it.
func delivered(ta *flytev1.TaskAction) bool {
	return terminal(ta) && publisher.Delivered(ta)
}

func TestEveryPhaseChangeReachesTheEventsService(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "reported", "test-flaky", map[string]string{"failAttempts": "1"})
	ta.Spec.RunName = "events-" + ns[len(ns)-6:]
	ta.Spec.Retries = 1
	create(t, ta)
	got := waitFor(t, ta, "delivered", delivered)

	evs := storedEvents(t, got)
	if len(evs) != len(got.Status.PhaseHistory) {
		t.Fatalf("%d events stored; want one per history entry (%d)", len(evs), len(got.Status.PhaseHistory))
	}
	for i, h := range got.Status.PhaseHistory {
		e := evs[i]
		if e.GetAttempt() != uint32(h.Attempt) || e.GetVersion() != uint32(h.Version) || e.GetReason() != h.Reason ||
			e.GetCluster() != "test-cluster" || e.GetTaskType() != "test-flaky" {
			t.Fatalf("event %d = %v; history entry %+v", i, e, h)
		}
	}
	// The retried attempt carries the error that caused it.
	if evs[1].GetError().GetCode() != "ExitCode1" || evs[1].GetError().GetKind() != flytecorev1.ExecutionError_KIND_USER {
		t.Fatalf("retry event %v lacks the user error", evs[1])
	}
	last := evs[len(evs)-1]
	if last.GetPhase() != flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED || last.GetAttempt() != 2 {
		t.Fatalf("last event %v", last)
	}
}

func TestEventsSurviveAnOutage(t *testing.T) {
	ns := env.Namespace(t)
	eventsSvc.stop()
	restarted := false
	defer func() {
		if !restarted {
			_ = eventsSvc.start()
		}
	}()

	var actions []*flytev1.TaskAction
	for i := range 5 {
		ta := newAction(ns, fmt.Sprintf("outage-%d", i), "core-sleep", map[string]string{"duration": "0s"})
		ta.Spec.RunName = "outage-" + ns[len(ns)-6:]
		create(t, ta)
		actions = append(actions, ta)
	}
	// Execution does not wait for the events service...
	for _, ta := range actions {
		waitFor(t, ta, "succeeded", func(a *flytev1.TaskAction) bool { return a.Status.Phase == flytev1.PhaseSucceeded })
	}
	// ...but a finished action is not released to the garbage collector before its
	// history is recorded.
	time.Sleep(300 * time.Millisecond)
	for _, ta := range actions {
		var got flytev1.TaskAction
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil {
			t.Fatal(err)
		}
		if publisher.Delivered(&got) {
			t.Fatalf("%s counts as delivered while the events service is down", ta.Name)
		}
	}

	if err := eventsSvc.start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	for _, ta := range actions {
		got := waitFor(t, ta, "delivered after the outage", delivered)
		if evs := storedEvents(t, got); len(evs) != len(got.Status.PhaseHistory) {
			t.Fatalf("%s: %d events stored; want exactly %d", ta.Name, len(evs), len(got.Status.PhaseHistory))
		}
	}
}

func TestDeletionIsReportedAsAborted(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "deleted", "test-finalizer", nil)
	ta.Spec.RunName = "deleted-" + ns[len(ns)-6:]
	create(t, ta)
	running := waitFor(t, ta, "running", func(a *flytev1.TaskAction) bool { return a.Status.Phase == flytev1.PhaseRunning })
	if err := env.Client.Delete(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ta)
	evs := storedEvents(t, running)
	if last := evs[len(evs)-1]; last.GetPhase() != flytecorev1.ActionPhase_ACTION_PHASE_ABORTED {
		t.Fatalf("last event %v; want ABORTED", last)
	}
}
