package controller_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/metricstest"
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
	gc := controller.NewGarbageCollector(own, own, controller.GarbageCollectorOptions{Interval: time.Hour, MaxTTL: time.Hour,
		Delivered: func(ta *flytev1.TaskAction) bool { return !undelivered[ta.Name] },
		Clock:     clocktesting.NewFakePassiveClock(now), Log: slog.New(slog.DiscardHandler)})
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
	gc := controller.NewGarbageCollector(both, env.Client, controller.GarbageCollectorOptions{Interval: time.Hour, MaxTTL: time.Hour,
		MaxFinished: 6, MaxFinishedPerNamespace: 4, DeletesPerSecond: 4,
		Delivered: func(ta *flytev1.TaskAction) bool { return !undelivered[ta.Name] },
		Clock:     clocktesting.NewFakePassiveClock(now), Log: slog.New(slog.DiscardHandler)})
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

// An action the API server refuses to delete (a webhook, a policy, RBAC) does not stop
// the collection: the collector skips it, counts it, reports it (a log line, a Warning
// Event on the action) and deletes the rest in the same pass, so the bound holds for the
// actions that can go. It tries the refused one again after a backoff, not on every
// pass, so that it does not spend each pass's delete budget.
func TestGarbageCollectorSkipsAnActionItCannotDelete(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	now := time.Now()
	const heldLabel = "test.flyte.org/held"
	seed := func(name string, finished time.Duration, held bool) *flytev1.TaskAction {
		t.Helper()
		ta := newAction(ns, name, "test-finalizer", nil)
		if held {
			ta.Labels = map[string]string{heldLabel: ns}
		}
		create(t, ta)
		ta = waitFor(t, ta, "running", func(a *flytev1.TaskAction) bool { return a.Status.Phase == flytev1.PhaseRunning })
		done := metav1.NewTime(now.Add(-finished))
		ta.Status = flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, Attempts: 1, PhaseHistory: ta.Status.PhaseHistory, CompletedAt: &done}
		if err := env.Client.Status().Update(ctx, ta); err != nil {
			t.Fatal(err)
		}
		return ta
	}
	// The oldest is held; 2 finished are allowed; 5 others can go.
	held := seed("held", 10*time.Minute, true)
	for i := 5; i >= 1; i-- {
		seed(fmt.Sprintf("done-%dm", i), time.Duration(i)*time.Minute, false)
	}
	kubetest.RefuseDeletes(t, env.Client, heldLabel, ns, held)

	reg := prometheus.NewRegistry()
	instruments, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	clock := clocktesting.NewFakeClock(now)
	own := client.NewNamespacedClient(env.Client, ns)
	gc := controller.NewGarbageCollector(own, own, controller.GarbageCollectorOptions{Interval: time.Minute, MaxTTL: 1000 * time.Hour,
		MaxFinishedPerNamespace: 2, Clock: clock, Recorder: reconciler.Recorder, Metrics: instruments,
		Log: slog.New(slog.NewTextHandler(&logged, nil))})
	gone := func(name string) bool {
		var ta flytev1.TaskAction
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ta)
		return apierrors.IsNotFound(err) || (err == nil && !ta.DeletionTimestamp.IsZero())
	}
	type pass struct {
		before         func()
		deleted        int
		refused        int
		undeletable    int
		gone, kept     []string
		refusalsMetric string
	}
	passes := []pass{
		// The 4 oldest are over the bound: held is refused, the 3 others go.
		{deleted: 3, refused: 1, undeletable: 1, gone: []string{"done-5m", "done-4m", "done-3m"},
			kept: []string{"held", "done-2m", "done-1m"}, refusalsMetric: "1"},
		// A new one finishes: the oldest deletable goes; held, in its backoff, is not
		// tried again.
		{before: func() { seed("done-0m", 0, false) }, deleted: 1, refused: 0, undeletable: 1,
			gone: []string{"done-2m"}, kept: []string{"held", "done-1m", "done-0m"}, refusalsMetric: "1"},
		// Past its backoff it is tried again, and refused again.
		{before: func() { clock.Step(3 * time.Minute) }, deleted: 0, refused: 1, undeletable: 1,
			kept: []string{"held", "done-1m", "done-0m"}, refusalsMetric: "2"},
		// Released, it goes on its next try, and the bound holds for all three.
		{before: func() {
			patch := client.MergeFrom(held.DeepCopy())
			held.Labels = nil
			if err := env.Client.Patch(ctx, held, patch); err != nil {
				t.Fatal(err)
			}
			clock.Step(time.Hour)
		}, deleted: 1, refused: 0, undeletable: 0, gone: []string{"held"}, kept: []string{"done-1m", "done-0m"}, refusalsMetric: "2"},
	}
	for i, p := range passes {
		if p.before != nil {
			p.before()
		}
		c, err := gc.Collect(ctx)
		if err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
		if c.Deleted != p.deleted || c.Refused != p.refused || c.Undeletable != p.undeletable {
			t.Fatalf("pass %d: deleted %d, refused %d, undeletable %d; want %d, %d, %d",
				i, c.Deleted, c.Refused, c.Undeletable, p.deleted, p.refused, p.undeletable)
		}
		for _, name := range p.gone {
			if !gone(name) {
				t.Errorf("pass %d: %s kept; want it deleted", i, name)
			}
		}
		for _, name := range p.kept {
			if gone(name) {
				t.Errorf("pass %d: %s deleted; want it kept", i, name)
			}
		}
		metricstest.Require(t, reg,
			`flyte_executor_gc_delete_refusals_total{reason="forbidden"} `+p.refusalsMetric,
			fmt.Sprintf(`flyte_executor_gc_undeletable_actions %d`, p.undeletable))
	}
	if n := strings.Count(logged.String(), "could not delete a finished action"); n < 1 {
		t.Errorf("the refusal was not logged:\n%s", logged.String())
	}
	if !strings.Contains(logged.String(), "held for an investigation") {
		t.Errorf("the log does not say why the action was refused:\n%s", logged.String())
	}
	eventually.True(t, 30*time.Second, func() bool {
		var events corev1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "held" && e.Type == corev1.EventTypeWarning && e.Reason == controller.ReasonDeleteRefused &&
				strings.Contains(e.Message, "held for an investigation") {
				return true
			}
		}
		return false
	}, func() string { return "no Warning Event " + controller.ReasonDeleteRefused + " on the held action" })
}
