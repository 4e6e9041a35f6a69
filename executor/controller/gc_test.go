package controller_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
)

func TestGarbageCollectorDeletesOnlyOldFinishedActions(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	now := time.Now()
	// Each action first runs (test-finalizer runs until deleted, and is not requeued);
	// then the test writes the status it wants. A status write does not wake the
	// reconciler, so the seeds stay as written.
	type seed struct {
		name     string
		phase    flytev1.Phase
		finished time.Duration // ago; 0 = not finished
		labeled  bool
		wantGone bool
	}
	seeds := []seed{
		{"old-succeeded", flytev1.PhaseSucceeded, 2 * time.Hour, true, true},
		{"old-failed", flytev1.PhaseFailed, 3 * time.Hour, true, true},
		{"recent", flytev1.PhaseSucceeded, 10 * time.Minute, true, false},
		{"running", flytev1.PhaseRunning, 0, false, false},
		{"old-unlabeled", flytev1.PhaseSucceeded, 2 * time.Hour, false, false},
	}
	for i := range 7 { // more than a page
		seeds = append(seeds, seed{fmt.Sprintf("old-%d", i), flytev1.PhaseAborted, 5 * time.Hour, true, true})
	}
	for _, s := range seeds {
		ta := newAction(ns, s.name, "test-finalizer", nil)
		if s.labeled {
			ta.Labels = map[string]string{controller.LabelTerminal: "true"}
		}
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
	}
	gc := &controller.GarbageCollector{Reader: env.Client, Writer: env.Client, Interval: time.Hour, MaxTTL: time.Hour,
		Clock: clocktesting.NewFakePassiveClock(now), Log: slog.New(slog.DiscardHandler), PageSize: 3}
	n, err := gc.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, s := range seeds {
		if s.wantGone {
			want++
		}
	}
	if n != want {
		t.Fatalf("deleted %d; want %d", n, want)
	}
	for _, s := range seeds {
		var ta flytev1.TaskAction
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, &ta)
		gone := apierrors.IsNotFound(err) || (err == nil && !ta.DeletionTimestamp.IsZero())
		if gone != s.wantGone {
			t.Errorf("%s: gone=%v; want %v (err %v)", s.name, gone, s.wantGone, err)
		}
	}
}
