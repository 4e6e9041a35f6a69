package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/test/eventually"
)

// An action refused a wait hundreds of times (a full namespace, for hours) keeps a small
// history, and what follows the wait still reaches the events service: numbering entries
// by counting the ones left gave every entry past the history's cap the same version,
// and nothing after it was ever handed over.
func TestLongWaitStaysSmallAndIsDelivered(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "quota-wait", "test-waits", map[string]string{"waits": "300"})
	ta.Spec.RunName = "wait-" + ns[len(ns)-6:]
	create(t, ta)
	got := waitFor(t, ta, "delivered", delivered)
	if got.Status.Phase != flytev1.PhaseSucceeded {
		t.Fatalf("ended %s: %s", got.Status.Phase, history(got))
	}
	h := got.Status.PhaseHistory
	if len(h) > 4 {
		t.Fatalf("%d history entries for one long wait; want it folded: %s", len(h), history(got))
	}
	var wait *flytev1.PhaseTransition
	for i := range h {
		if h[i].Phase == flytev1.PhaseWaitingForResources {
			wait = &h[i]
		}
	}
	if wait == nil || wait.Count != 300 || wait.Message != "refused 300 times" {
		t.Fatalf("wait entry %+v; want one counted 300 times", wait)
	}
	evs := storedEvents(t, got)
	if last := evs[len(evs)-1]; last.GetPhase() != flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED {
		t.Fatalf("the events service's last event is %v; want SUCCEEDED", last)
	}
	seen := map[string]bool{}
	for _, e := range evs {
		id := fmt.Sprintf("%d/%s/%d", e.GetAttempt(), e.GetPhase(), e.GetVersion())
		if seen[id] {
			t.Fatalf("two events share the identity %s", id)
		}
		seen[id] = true
	}
}

// A heartbeated reservation lives as long as its action: however the action goes, an
// identical one takes over at once instead of waiting for ever (or for the reservation
// to lapse, had the heartbeats stopped).
func TestReservationEndsWithItsAction(t *testing.T) {
	tests := []struct {
		name string
		// remove takes the holder away once it runs holding the reservation.
		remove func(t *testing.T, ta *flytev1.TaskAction)
	}{
		{"deleted, aborted through its finalizer", func(t *testing.T, ta *flytev1.TaskAction) {
			if err := env.Client.Delete(context.Background(), ta); err != nil {
				t.Fatal(err)
			}
		}},
		{"its finalizer taken off by hand, then deleted", func(t *testing.T, ta *flytev1.TaskAction) {
			stripFinalizerAndDelete(t, ta)
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			holder := cachedAction(t, ns, fmt.Sprintf("holder-%d", i), `{"x": 1}`, true, map[string]string{"runFor": "1h"})
			create(t, holder)
			waitFor(t, holder, "running with its finalizer", runningWithFinalizer)
			waiter := cachedAction(t, ns, fmt.Sprintf("waiter-%d", i), `{"x": 1}`, true, map[string]string{"runFor": "1h"})
			create(t, waiter)
			waitFor(t, waiter, "waiting for the cache", func(a *flytev1.TaskAction) bool { return containsReason(a, flytev1.ReasonWaitingForCache) })

			tt.remove(t, holder)
			waitGone(t, holder)
			// The waiter looks again within a heartbeat (1 s); a reservation left to lapse
			// would take three missed ones, and one still heartbeated for ever.
			took := time.Now()
			waitFor(t, waiter, "running in its turn", func(a *flytev1.TaskAction) bool { return a.Status.Phase == flytev1.PhaseRunning })
			if d := time.Since(took); d > 2500*time.Millisecond {
				t.Fatalf("the waiter ran %s after the holder went; want its reservation released at once", d)
			}
			if err := env.Client.Delete(context.Background(), waiter); err != nil {
				t.Fatal(err)
			}
			waitGone(t, waiter)
		})
	}
}

// Deleting an action that waits for the cache takes nothing from the holder.
func TestDeletingAWaiterLeavesTheHolder(t *testing.T) {
	ns := env.Namespace(t)
	holder := cachedAction(t, ns, "holder", `{"y": 1}`, true, map[string]string{"runFor": "2s"})
	create(t, holder)
	waitFor(t, holder, "running with its finalizer", runningWithFinalizer)
	waiter := cachedAction(t, ns, "waiter", `{"y": 1}`, true, map[string]string{"runFor": "2s"})
	create(t, waiter)
	waitFor(t, waiter, "waiting for the cache", func(a *flytev1.TaskAction) bool { return containsReason(a, flytev1.ReasonWaitingForCache) })
	if err := env.Client.Delete(context.Background(), waiter); err != nil {
		t.Fatal(err)
	}
	waitGone(t, waiter)
	// A third identical action still waits for the holder, then hits its outputs.
	third := cachedAction(t, ns, "third", `{"y": 1}`, true, map[string]string{"runFor": "2s"})
	create(t, third)
	got := waitFor(t, third, "finished", terminal)
	if got.Status.CacheStatus != flytev1.CacheHit || !containsReason(got, flytev1.ReasonWaitingForCache) {
		t.Fatalf("third: cache %s, history %s; want a hit after waiting for the holder", got.Status.CacheStatus, history(got))
	}
}

// An in-process action can go without a last pass: deleted in the moment between the
// first pass's status write, which reported it Running, and its finalizer (or with its
// finalizer taken off by hand). The events service must still hear that it ended.
func TestVanishedActionIsRecordedAborted(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "vanished", "test-echo", map[string]string{"runFor": "1h"})
	ta.Spec.RunName = "vanished-" + ns[len(ns)-6:]
	create(t, ta)
	waitFor(t, ta, "running with its finalizer", runningWithFinalizer)
	stripFinalizerAndDelete(t, ta)
	waitGone(t, ta)
	var last flytecorev1.ActionPhase
	eventually.True(t, 30*time.Second, func() bool {
		evs := storedEvents(t, ta)
		last = evs[len(evs)-1].GetPhase()
		return last == flytecorev1.ActionPhase_ACTION_PHASE_ABORTED
	}, func() string { return fmt.Sprintf("the events service's last event is %s; want ABORTED", last) })
}

// What the reconciler and the cache hold per action ends with the action's last write
// or with the action: nothing stays behind for actions that finished.
func TestFinishedActionsLeaveNothingBehind(t *testing.T) {
	ns := env.Namespace(t)
	var actions []*flytev1.TaskAction
	for i := range 50 {
		ta := newAction(ns, fmt.Sprintf("done-%d", i), "core-sleep", map[string]string{"duration": "10ms"})
		if i%5 == 0 {
			ta = cachedAction(t, ns, fmt.Sprintf("done-%d", i), fmt.Sprintf(`{"i": %d}`, i), true, nil)
		}
		actions = append(actions, ta)
		create(t, ta)
	}
	for _, ta := range actions {
		waitFor(t, ta, "delivered", delivered)
	}
	// Other tests run meanwhile; their actions are running, so some expectations and
	// reservations may be theirs. Ours must not be among them.
	for _, ta := range actions {
		var got flytev1.TaskAction
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil {
			t.Fatal(err)
		}
		eventually.True(t, 10*time.Second, func() bool { return !reconciler.Expects(got.UID) },
			func() string { return fmt.Sprintf("the reconciler still expects a write of the finished %s", ta.Name) })
		if outputs.Holds(got.UID) {
			t.Fatalf("a reservation of the finished %s is still heartbeated", ta.Name)
		}
	}
}

func runningWithFinalizer(a *flytev1.TaskAction) bool {
	return a.Status.Phase == flytev1.PhaseRunning && controllerutil.ContainsFinalizer(a, controller.Finalizer)
}

// stripFinalizerAndDelete takes the action's finalizer off, as an operator might, and
// deletes it, so that it goes at once without a last pass.
func stripFinalizerAndDelete(t *testing.T, ta *flytev1.TaskAction) {
	t.Helper()
	var got flytev1.TaskAction
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(got.DeepCopy())
	controllerutil.RemoveFinalizer(&got, controller.Finalizer)
	if err := env.Client.Patch(context.Background(), &got, patch); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(context.Background(), &got); err != nil {
		t.Fatal(err)
	}
}
