package executor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
)

// TestCollectorWaitsForRedeliveryAfterARestart: an executor that restarts knows nothing
// of what it delivered, so it delivers every finished action's history again before its
// garbage collector may delete the action. While the events service is down, nothing is
// collected; once it is back, everything is, and each event is stored exactly once.
func TestCollectorWaitsForRedeliveryAfterARestart(t *testing.T) {
	svc, eventsClient, restartEvents := restartableEvents(t)

	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.EventsServiceURL = svc.URL
	var count atomic.Int64
	stopFirst := run(t, cfg, ns, &count)
	actions := createActions(t, 5, func(i int) *flytev1.TaskAction {
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("done-%d", i), Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "collected", ActionName: fmt.Sprintf("done-%d", i),
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/collected", Config: map[string]string{"duration": "0s"}},
		}
	})
	history := map[string]int{}
	for _, ta := range actions {
		history[ta.Name] = len(waitDelivered(t, eventsClient, ta).Status.PhaseHistory)
	}
	stopFirst()

	// The events service goes down; a new executor starts, eager to collect.
	svc.Stop()
	cfg.GC.Interval, cfg.GC.MaxTTL = metav1.Duration{Duration: 100 * time.Millisecond}, metav1.Duration{Duration: time.Millisecond}
	run(t, cfg, ns, &count)
	time.Sleep(2 * time.Second) // twenty collections
	for _, ta := range actions {
		var got flytev1.TaskAction
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil || !got.DeletionTimestamp.IsZero() {
			t.Fatalf("%s was collected before its history was delivered again (err %v)", ta.Name, err)
		}
	}

	restartEvents()
	for _, ta := range actions {
		eventually.True(t, time.Minute, func() bool {
			return apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &flytev1.TaskAction{}))
		}, func() string { return ta.Name + " was never collected after the events service came back" })
		if stored := len(listEvents(t, eventsClient, ta)); stored != history[ta.Name] {
			t.Fatalf("%s: %d events stored; want its %d history entries, once each", ta.Name, stored, history[ta.Name])
		}
	}
}

// TestCollectionGoesOnPastAnActionItCannotDelete: an executor whose API server refuses
// to delete one finished action (here an admission policy; in a cluster a webhook or
// RBAC may) collects the others all the same, and says so on the refused action with a
// Warning Event.
func TestCollectionGoesOnPastAnActionItCannotDelete(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	const heldLabel = "test.flyte.org/held"
	actions := createActions(t, 4, func(i int) *flytev1.TaskAction {
		ta := &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("done-%d", i), Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "refused", ActionName: fmt.Sprintf("done-%d", i),
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/refused", Config: map[string]string{"duration": "0s"}},
		}
		if i == 0 {
			ta.Labels = map[string]string{heldLabel: ns}
		}
		return ta
	})
	held := actions[0]
	kubetest.RefuseDeletes(t, env.Client, heldLabel, ns, held)

	cfg := testConfig()
	cfg.GC.Interval, cfg.GC.MaxTTL = metav1.Duration{Duration: 100 * time.Millisecond}, metav1.Duration{Duration: time.Millisecond}
	var count atomic.Int64
	run(t, cfg, ns, &count)
	for _, ta := range actions[1:] {
		eventually.True(t, time.Minute, func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(ta), &flytev1.TaskAction{}))
		}, func() string { return ta.Name + " was never collected" })
	}
	eventually.True(t, time.Minute, func() bool {
		var events corev1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == held.Name && e.Type == corev1.EventTypeWarning && e.Reason == controller.ReasonDeleteRefused {
				return true
			}
		}
		return false
	}, func() string { return "no Warning Event " + controller.ReasonDeleteRefused + " on the refused action" })
	var got flytev1.TaskAction
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(held), &got); err != nil || !got.DeletionTimestamp.IsZero() {
		t.Fatalf("the refused action is gone (err %v); want it kept", err)
	}
}
