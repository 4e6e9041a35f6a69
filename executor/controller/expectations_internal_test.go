package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// A cached copy older than this process's own write (its history or its finalizer) is
// stale until the informer shows the write, or until the expectation lapses: a cache
// that never shows it (someone else took the finalizer off) must not hold the action
// back for ever.
func TestExpectationsSeeTheCacheBehindOwnWrites(t *testing.T) {
	action := func(entries int32, finalizer bool) *flytev1.TaskAction {
		ta := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{UID: "a"}}
		for v := int32(1); v <= entries; v++ {
			ta.Status.PhaseHistory = append(ta.Status.PhaseHistory, flytev1.PhaseTransition{Attempt: 1, Version: v})
		}
		if finalizer {
			controllerutil.AddFinalizer(ta, Finalizer)
		}
		return ta
	}
	tests := []struct {
		name      string
		written   func(*expectations)
		cached    *flytev1.TaskAction
		later     time.Duration
		wantStale bool
	}{
		{name: "nothing written", written: func(*expectations) {}, cached: action(1, true)},
		{name: "history written, cache behind", written: func(e *expectations) { e.expect(action(2, true)) }, cached: action(1, true), wantStale: true},
		{name: "history written, cache caught up", written: func(e *expectations) { e.expect(action(2, true)) }, cached: action(2, true)},
		{name: "finalizer removed, cache still holds it", written: func(e *expectations) { e.expectFinalizer(action(2, false)) }, cached: action(2, true), wantStale: true},
		{name: "finalizer removed, cache caught up", written: func(e *expectations) { e.expectFinalizer(action(2, false)) }, cached: action(2, false)},
		{name: "finalizer added, cache without it", written: func(e *expectations) { e.expectFinalizer(action(0, true)) }, cached: action(0, false), wantStale: true},
		{name: "history then finalizer, cache has the history only", written: func(e *expectations) {
			e.expect(action(2, true))
			e.expectFinalizer(action(2, false))
		}, cached: action(2, true), wantStale: true},
		{name: "finalizer then history, cache has the finalizer only", written: func(e *expectations) {
			e.expectFinalizer(action(1, true))
			e.expect(action(2, true))
		}, cached: action(1, true), wantStale: true},
		{name: "never shown, lapsed", written: func(e *expectations) { e.expectFinalizer(action(2, true)) }, cached: action(2, false), later: expectationLifetime + time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
			e := newExpectations()
			e.now = func() time.Time { return now }
			tt.written(e)
			now = now.Add(tt.later)
			if got := e.stale(tt.cached); got != tt.wantStale {
				t.Fatalf("stale = %v, want %v", got, tt.wantStale)
			}
			if !tt.wantStale && e.has(tt.cached.UID) {
				t.Fatal("an expectation met (or lapsed) is still held")
			}
		})
	}
}
