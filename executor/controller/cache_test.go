package controller_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// cachedAction is an identical test-echo action under another name; what it computes
// is keyed by its task, version, definition and inputs.
func cachedAction(t *testing.T, ns, name, inputs string, serializable bool, config map[string]string) *flytev1.TaskAction {
	t.Helper()
	inputPath := filepath.Join(dataDir, ns, "inputs-"+name+".json")
	if err := os.MkdirAll(filepath.Dir(inputPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inputPath, []byte(inputs), 0o644); err != nil {
		t.Fatal(err)
	}
	ta := newAction(ns, name, "test-echo", config)
	ta.Spec.TaskName = "demo.cached-" + ns // one task per test, so tests do not share entries
	ta.Spec.RunName = name
	ta.Spec.InputURI = "file://" + inputPath
	ta.Spec.RunOutputBase = "file://" + filepath.Join(dataDir, ns, name)
	ta.Spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: serializable}
	return ta
}

func TestCacheMissThenHit(t *testing.T) {
	ns := env.Namespace(t)
	first := cachedAction(t, ns, "first", `{"n": 1, "m": [1, 2]}`, false, nil)
	create(t, first)
	got := waitFor(t, first, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.CacheStatus != flytev1.CachePopulated {
		t.Fatalf("first: %s, cache %s", got.Status.Phase, got.Status.CacheStatus)
	}

	// Same inputs written differently: a hit, and nothing runs.
	second := cachedAction(t, ns, "second", `{"m":[1,2],"n":1}`, false, nil)
	create(t, second)
	hit := waitFor(t, second, "finished", terminal)
	if hit.Status.Phase != flytev1.PhaseSucceeded || hit.Status.CacheStatus != flytev1.CacheHit || history(hit) != "Queued/Queued@1 Succeeded/CacheHit@1" {
		t.Fatalf("second: %s, cache %s, history %s", hit.Status.Phase, hit.Status.CacheStatus, history(hit))
	}
	if c := calls.get(second.Name); len(c) != 0 {
		t.Fatalf("a cache hit ran the plugin: %v", c)
	}
	out, err := os.ReadFile(filepath.Join(dataDir, ns, "second", "second", "1", "outputs.json"))
	if err != nil || string(out) != `{"n": 1, "m": [1, 2]}` {
		t.Fatalf("the hit's outputs %q, %v; want the cached ones at its own location", out, err)
	}

	// Other inputs, or a changed definition, miss.
	for _, ta := range []*flytev1.TaskAction{
		cachedAction(t, ns, "other-inputs", `{"n": 2, "m": [1, 2]}`, false, nil),
		cachedAction(t, ns, "other-definition", `{"n": 1, "m": [1, 2]}`, false, map[string]string{"flag": "new"}),
	} {
		create(t, ta)
		got := waitFor(t, ta, "finished", terminal)
		if got.Status.CacheStatus != flytev1.CachePopulated || !slices.Contains(calls.get(ta.Name), "handle:1") {
			t.Fatalf("%s: cache %s, calls %v; want a miss that ran", ta.Name, got.Status.CacheStatus, calls.get(ta.Name))
		}
	}
}

func TestIdenticalSerializableActionsRunOnce(t *testing.T) {
	ns := env.Namespace(t)
	var actions []*flytev1.TaskAction
	for i := range 3 {
		ta := cachedAction(t, ns, fmt.Sprintf("twin-%d", i), `{"x": 42}`, true, map[string]string{"runFor": "1s"})
		actions = append(actions, ta)
	}
	for _, ta := range actions {
		create(t, ta)
	}
	ran, hits := 0, 0
	var holder string
	var waited []*flytev1.TaskAction
	for _, ta := range actions {
		got := waitFor(t, ta, "finished", terminal)
		if got.Status.Phase != flytev1.PhaseSucceeded {
			t.Fatalf("%s: %s", ta.Name, got.Status.Phase)
		}
		switch got.Status.CacheStatus {
		case flytev1.CachePopulated:
			ran++
			holder = got.Spec.RunName + "/" + got.Spec.ActionName
		case flytev1.CacheHit:
			hits++
			waited = append(waited, got)
			if !containsReason(got, flytev1.ReasonWaitingForCache) {
				t.Fatalf("%s hit without waiting: %s", ta.Name, history(got))
			}
			if c := calls.get(ta.Name); len(c) != 0 {
				t.Fatalf("%s waited but also ran: %v", ta.Name, c)
			}
		default:
			t.Fatalf("%s: cache %s", ta.Name, got.Status.CacheStatus)
		}
	}
	if ran != 1 || hits != 2 {
		t.Fatalf("%d ran and %d hit; want the work done once", ran, hits)
	}
	// The wait names the action it waited on, and when its reservation ran to.
	for _, got := range waited {
		for _, h := range got.Status.PhaseHistory {
			if h.Reason == flytev1.ReasonWaitingForCache && (!strings.Contains(h.Message, "waiting on "+holder+",") || !strings.Contains(h.Message, "reservation runs to")) {
				t.Fatalf("%s's wait says %q; want it to name %s and the reservation's end", got.Name, h.Message, holder)
			}
		}
	}
}

func containsReason(ta *flytev1.TaskAction, reason string) bool {
	for _, h := range ta.Status.PhaseHistory {
		if h.Reason == reason {
			return true
		}
	}
	return false
}

// TestTaskWithoutOutputsIsCachedToo: a task that succeeds without writing outputs (a
// side effect, a check) is remembered like any other: an identical action is a hit,
// with no outputs, and does not run.
func TestTaskWithoutOutputsIsCachedToo(t *testing.T) {
	ns := env.Namespace(t)
	sleeper := func(name string) *flytev1.TaskAction {
		ta := newAction(ns, name, "core-sleep", map[string]string{"duration": "0s"})
		ta.Spec.TaskName = "demo.no-outputs-" + ns
		ta.Spec.RunName = name
		ta.Spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true}
		return ta
	}
	first := sleeper("first")
	create(t, first)
	if got := waitFor(t, first, "finished", terminal); got.Status.Phase != flytev1.PhaseSucceeded || got.Status.CacheStatus != flytev1.CachePopulated {
		t.Fatalf("first: %s, cache %s; want Succeeded, Populated", got.Status.Phase, got.Status.CacheStatus)
	}
	second := sleeper("second")
	create(t, second)
	got := waitFor(t, second, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.CacheStatus != flytev1.CacheHit || got.Status.OutputsURI != "" {
		t.Fatalf("second: %s, cache %s, outputs %q; want a hit with no outputs", got.Status.Phase, got.Status.CacheStatus, got.Status.OutputsURI)
	}
}
