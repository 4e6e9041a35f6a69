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

// twoNamespaces lists the actions of two namespaces only, so that a collector sees this
// test's actions and not other tests'.
type twoNamespaces struct {
	client.Client
	a, b string
}

func (r twoNamespaces) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	var all flytev1.TaskActionList
	for _, ns := range []string{r.a, r.b} {
		var one flytev1.TaskActionList
		if err := r.Client.List(ctx, &one, append(opts, client.InNamespace(ns))...); err != nil {
			return err
		}
		all.Items = append(all.Items, one.Items...)
	}
	*list.(*flytev1.TaskActionList) = all
	return nil
}

// Over a bound on finished actions held, per namespace or in all, the collector deletes
// the oldest delivered ones first, long before their TTL; an undelivered one is counted
// but kept. Deletes are spread at DeletesPerSecond.
func TestGarbageCollectorBoundsFinishedActionsHeld(t *testing.T) {
	ctx := context.Background()
	a, b := env.Namespace(t), env.Namespace(t)
	now := time.Now()
	type seed struct {
		ns, name    string
		finished    time.Duration // ago
		undelivered bool
		wantGone    bool
	}
	seeds := []seed{
		// a holds 7 finished, 4 allowed: its undelivered oldest stays, its three oldest
		// delivered go.
		{a, "a-10m-undelivered", 10 * time.Minute, true, false},
		{a, "a-6m", 6 * time.Minute, false, true},
		{a, "a-5m", 5 * time.Minute, false, true},
		{a, "a-4m", 4 * time.Minute, false, true},
		{a, "a-3m", 3 * time.Minute, false, false},
		{a, "a-2m", 2 * time.Minute, false, false},
		{a, "a-1m", 1 * time.Minute, false, false},
		// Then both hold 7, 6 allowed in all: the oldest delivered of both goes.
		{b, "b-210s", 210 * time.Second, false, true},
		{b, "b-150s", 150 * time.Second, false, false},
		{b, "b-90s", 90 * time.Second, false, false},
	}
	undelivered := map[string]bool{}
	for _, s := range seeds {
		ta := newAction(s.ns, s.name, "test-finalizer", nil)
		create(t, ta)
		ta = waitFor(t, ta, "running", func(a *flytev1.TaskAction) bool { return a.Status.Phase == flytev1.PhaseRunning })
		done := metav1.NewTime(now.Add(-s.finished))
		ta.Status = flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, Attempts: 1, PhaseHistory: ta.Status.PhaseHistory, CompletedAt: &done}
		if err := env.Client.Status().Update(ctx, ta); err != nil {
			t.Fatal(err)
		}
		undelivered[s.name] = s.undelivered
	}
	both := twoNamespaces{Client: env.Client, a: a, b: b}
	gc := &controller.GarbageCollector{Reader: both, Writer: env.Client, Interval: time.Hour, MaxTTL: time.Hour,
		MaxFinished: 6, MaxFinishedPerNamespace: 4, DeletesPerSecond: 4,
		Delivered: func(ta *flytev1.TaskAction) bool { return !undelivered[ta.Name] },
		Clock:     clocktesting.NewFakePassiveClock(now), Log: slog.New(slog.DiscardHandler)}
	began := time.Now()
	c, err := gc.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Four deletes at 4/s with a burst of one take at least 0.75 s.
	if took := time.Since(began); took < 700*time.Millisecond {
		t.Errorf("4 deletes took %s at 4/s; want them spread", took)
	}
	if c.Deleted != 4 || c.Finished != 10 {
		t.Fatalf("deleted %d of %d finished; want 4 of 10", c.Deleted, c.Finished)
	}
	for _, s := range seeds {
		var ta flytev1.TaskAction
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: s.name}, &ta)
		gone := apierrors.IsNotFound(err) || (err == nil && !ta.DeletionTimestamp.IsZero())
		if gone != s.wantGone {
			t.Errorf("%s: gone %v (err %v); want %v", s.name, gone, err, s.wantGone)
		}
	}
}
