package controller_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
)

// gauge reads the flyte_executor_actions gauge by phase.
func gauge(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "flyte_executor_actions" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return got
}

// stored counts the actions the API server holds, by phase, as the gauge does.
func stored(t *testing.T) map[string]float64 {
	t.Helper()
	var list flytev1.TaskActionList
	if err := env.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, ta := range list.Items {
		got[string(cmp.Or(ta.Status.Phase, flytev1.PhaseQueued))]++
	}
	return got
}

// The actions gauge counts what the informer cache holds when it is scraped, so it
// agrees with the API server once the cache has caught up: with a running action, and
// after it was deleted, without the reconciler keeping a tally.
func TestActionsGaugeCountsTheCache(t *testing.T) {
	ns := env.Namespace(t)
	agree := func(what string) map[string]float64 {
		t.Helper()
		var g, s map[string]float64
		eventually.True(t, 30*time.Second, func() bool {
			g, s = gauge(t), stored(t)
			same := true
			for _, p := range []string{"Queued", "WaitingForResources", "Initializing", "Running", "Succeeded", "Failed", "Aborted", "TimedOut"} {
				same = same && g[p] == s[p]
			}
			return same
		}, func() string { return fmt.Sprintf("%s: the gauge says %v; the API server holds %v", what, g, s) })
		return g
	}
	ta := newAction(ns, "counted", "test-finalizer", nil)
	create(t, ta)
	running := waitFor(t, ta, "running", func(a *flytev1.TaskAction) bool { return a.Status.Phase == flytev1.PhaseRunning })
	if g := agree("running"); g["Running"] < 1 {
		t.Fatalf("the running action is not counted: %v", g)
	}
	if err := env.Client.Delete(context.Background(), running); err != nil {
		t.Fatal(err)
	}
	waitGone(t, running)
	agree("deleted")
}
