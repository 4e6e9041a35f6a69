package controller_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/internal/eventually"
)

// The collector picks actions by their status: finished more than MaxTTL ago, with their
// history delivered. It deletes a finished action without aborting it, so no Aborted
// phase is recorded for an action that had finished.
func TestGarbageCollectorDeletesOnlyOldDeliveredFinishedActions(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	now := time.Now()
	// Each action first runs (test-finalizer runs until deleted, is not requeued, and
	// keeps its finalizer, so a deletion that aborted would show in the call log); then
	// the test writes the status it wants. A status write does not wake the reconciler,
	// so the seeds stay as written.
	type seed struct {
		name        string
		phase       flytev1.Phase
		finished    time.Duration // ago; 0 = not finished
		undelivered bool
		wantGone    bool
	}
	seeds := []seed{
		{"old-succeeded", flytev1.PhaseSucceeded, 2 * time.Hour, false, true},
		{"old-failed", flytev1.PhaseFailed, 3 * time.Hour, false, true},
		{"old-timed-out", flytev1.PhaseTimedOut, 3 * time.Hour, false, true},
		{"recent", flytev1.PhaseSucceeded, 10 * time.Minute, false, false},
		{"running", flytev1.PhaseRunning, 0, false, false},
		{"old-undelivered", flytev1.PhaseSucceeded, 2 * time.Hour, true, false},
	}
	for i := range 5 {
		seeds = append(seeds, seed{fmt.Sprintf("old-%d", i), flytev1.PhaseAborted, 5 * time.Hour, false, true})
	}
	undelivered := map[string]bool{}
	for _, s := range seeds {
		ta := newAction(ns, s.name, "test-finalizer", nil)
		create(t, ta)
		ta = waitFor(t, ta, "running", func(a *flytev1.TaskAction) bool { return a.Status.Phase == flytev1.PhaseRunning })
		ta.Status = flytev1.TaskActionStatus{Phase: s.phase, Attempts: 1, PhaseHistory: ta.Status.PhaseHistory}
		if s.finished > 0 {
			done := metav1.NewTime(now.Add(-s.finished))
			ta.Status.CompletedAt = &done
		}
		if err := env.Client.Status().Update(ctx, ta); err != nil {
			t.Fatal(err)
		}
		undelivered[s.name] = s.undelivered
	}
	// Only this test's namespace: other tests' actions (or this one's, run again with
	// -count) would be counted too.
	own := client.NewNamespacedClient(env.Client, ns)
	gc := &controller.GarbageCollector{Reader: own, Writer: own, Interval: time.Hour, MaxTTL: time.Hour,
		Delivered: func(ta *flytev1.TaskAction) bool { return !undelivered[ta.Name] },
		Clock:     clocktesting.NewFakePassiveClock(now), Log: slog.New(slog.DiscardHandler)}
	c, err := gc.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, s := range seeds {
		if s.wantGone {
			want++
		}
	}
	if c.Deleted != want || c.Undelivered != 1 {
		t.Fatalf("deleted %d, kept %d undelivered; want %d and 1", c.Deleted, c.Undelivered, want)
	}
	for _, s := range seeds {
		key := client.ObjectKey{Namespace: ns, Name: s.name}
		if !s.wantGone {
			var ta flytev1.TaskAction
			if err := env.Client.Get(ctx, key, &ta); err != nil || !ta.DeletionTimestamp.IsZero() {
				t.Errorf("%s: collected (err %v); want kept", s.name, err)
			}
			continue
		}
		eventually.True(t, 30*time.Second, func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, key, &flytev1.TaskAction{})) },
			func() string { return s.name + " was never deleted" })
		if slices.Contains(calls.get(s.name), "abort") {
			t.Errorf("%s: collecting a finished action aborted it: %v", s.name, calls.get(s.name))
		}
	}
}
