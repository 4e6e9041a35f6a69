package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/test/eventually"
)

func newAction(ns, name, taskType string, config map[string]string) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: flytev1.TaskActionSpec{
			Project: "demo", Domain: "development", RunName: "r1", ActionName: name,
			TaskName: "demo." + taskType, TaskType: taskType, RunOutputBase: "mem://outputs/r1", Config: config,
		},
	}
}

func create(t *testing.T, ta *flytev1.TaskAction) {
	t.Helper()
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatalf("creating %s: %v", ta.Name, err)
	}
}

// waitFor polls the action until cond holds, and returns it.
func waitFor(t *testing.T, ta *flytev1.TaskAction, what string, cond func(*flytev1.TaskAction) bool) *flytev1.TaskAction {
	t.Helper()
	var got flytev1.TaskAction
	var err error
	eventually.True(t, 30*time.Second, func() bool {
		err = env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got)
		return err == nil && cond(&got)
	}, func() string {
		return fmt.Sprintf("%s never became %s; last seen %+v (err %v)", ta.Name, what, got.Status, err)
	})
	return &got
}

// waitGone waits until a deleted action is gone from the API server.
func waitGone(t *testing.T, ta *flytev1.TaskAction) {
	t.Helper()
	var err error
	eventually.True(t, 30*time.Second, func() bool {
		err = env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &flytev1.TaskAction{})
		return apierrors.IsNotFound(err)
	}, func() string { return fmt.Sprintf("%s was never released: %v", ta.Name, err) })
}

// terminal: finished, and the finalizer taken off in the same pass.
func terminal(ta *flytev1.TaskAction) bool {
	return ta.Status.Phase.IsTerminal() && !controllerutil.ContainsFinalizer(ta, controller.Finalizer)
}

func history(ta *flytev1.TaskAction) string {
	var parts []string
	for _, h := range ta.Status.PhaseHistory {
		parts = append(parts, string(h.Phase)+"/"+h.Reason+"@"+string(rune('0'+h.Attempt)))
	}
	return strings.Join(parts, " ")
}

func TestSleepRunsToSucceeded(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "sleepy", "core-sleep", map[string]string{"duration": "300ms"})
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)

	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 1 || got.Status.CompletedAt == nil || got.Status.StartedAt == nil {
		t.Fatalf("status %+v", got.Status)
	}
	if h := history(got); h != "Queued/Queued@1 Running/Sleeping@1 Succeeded/Succeeded@1" {
		t.Fatalf("phase history %s", h)
	}
	for typ, want := range map[string]metav1.ConditionStatus{
		flytev1.ConditionSucceeded: metav1.ConditionTrue, flytev1.ConditionProgressing: metav1.ConditionFalse,
	} {
		if c := findCondition(got, typ); c == nil || c.Status != want {
			t.Fatalf("condition %s = %+v; want %s", typ, c, want)
		}
	}
	if controllerutil.ContainsFinalizer(got, controller.Finalizer) {
		t.Fatal("an in-process sleep does not need a finalizer")
	}
	// The sleep wakes the action once, then it finishes; its own status writes do not
	// wake it again. A few extra passes come from the label patch and from waiting for
	// the informer cache to catch up; a hot loop would be dozens.
	if n := reconcileCount(ns, ta.Name); n > 8 {
		t.Fatalf("%d reconciles for one sleep; want at most 8", n)
	}
}

func TestZeroSleepFinishesInOnePass(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "instant", "core-sleep", map[string]string{"duration": "0s"})
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseSucceeded || history(got) != "Queued/Queued@1 Succeeded/Succeeded@1" {
		t.Fatalf("status %s: %s", got.Status.Phase, history(got))
	}
	time.Sleep(200 * time.Millisecond) // let any stray reconcile happen
	if n := reconcileCount(ns, ta.Name); n > 6 {
		t.Fatalf("%d reconciles; want at most 6", n)
	}
}

func TestUnknownTaskTypeFailsAtOnce(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "mystery", "no-such-type", nil)
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Error == nil || got.Status.Error.Code != flytev1.ReasonUnknownTaskType {
		t.Fatalf("status %+v", got.Status)
	}
	if controllerutil.ContainsFinalizer(got, controller.Finalizer) {
		t.Fatal("a failed-at-once action got a finalizer")
	}
}

func TestInvalidSpecFailsAtOnce(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "bad-uri", "core-echo", nil)
	ta.Spec.RunOutputBase = "not a uri"
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Error == nil || got.Status.Error.Code != flytev1.ReasonInvalidSpec ||
		!strings.Contains(got.Status.Error.Message, "spec.runOutputBase") {
		t.Fatalf("status %+v", got.Status)
	}
}

func TestUserRetriesMakeNewAttempts(t *testing.T) {
	ns := env.Namespace(t)
	ok := newAction(ns, "flaky-ok", "test-flaky", map[string]string{"failAttempts": "2"})
	ok.Spec.Retries = 2
	exhausted := newAction(ns, "flaky-exhausted", "test-flaky", map[string]string{"failAttempts": "2"})
	exhausted.Spec.Retries = 1
	create(t, ok)
	create(t, exhausted)

	got := waitFor(t, ok, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 3 || got.Status.SystemFailures != 0 {
		t.Fatalf("status %+v", got.Status)
	}
	// Each failed attempt ends with an entry of its own, carrying its error; the next
	// attempt starts Queued.
	if h := historyWithErrors(got); h != "Queued/Queued@1 Failed/AttemptFailed@1(ExitCode1) Queued/Retrying@2 "+
		"Failed/AttemptFailed@2(ExitCode1) Queued/Retrying@3 Succeeded/Succeeded@3" {
		t.Fatalf("phase history %s; want every attempt in it, each ending with its own failure", h)
	}
	// Each attempt is handled and finalized before the next begins. (A pass may be
	// repeated after a write conflict; Handle and Finalize are idempotent, so repeats of
	// the same step are allowed.)
	if c := slices.Compact(calls.get(ok.Name)); !slices.Equal(dedupeSteps(c), []string{"handle:1", "finalize", "handle:2", "finalize", "handle:3", "finalize"}) {
		t.Fatalf("plugin calls %v; want attempts 1, 2, 3 in order, each finalized", c)
	}
	// Backoff: attempt 3 started at least the second delay (2 x 50ms, jitter fixed at
	// half: 75ms) after attempt 2 was scheduled.
	h := got.Status.PhaseHistory
	if gap := h[5].OccurredAt.Sub(h[4].OccurredAt.Time); gap < 75*time.Millisecond {
		t.Fatalf("attempt 3 finished %s after attempt 2 was scheduled; want the backoff (75ms) between", gap)
	}

	got = waitFor(t, exhausted, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Attempts != 2 || got.Status.Error == nil ||
		got.Status.Error.Kind != flytev1.ErrorKindUser || got.Status.Error.Code != "ExitCode1" {
		t.Fatalf("status %+v", got.Status)
	}
	if c := findCondition(got, flytev1.ConditionFailed); c == nil || c.Reason != flytev1.ReasonRetriesExhausted {
		t.Fatalf("failed condition %+v", c)
	}
}

func TestSystemFailuresHaveTheirOwnBudget(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "lost-nodes", "test-system", nil)
	ta.Spec.Retries = 0 // user retries are not what system failures spend
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.SystemFailures != maxSystemFailures+1 ||
		got.Status.Attempts != maxSystemFailures+1 || got.Status.Error == nil || got.Status.Error.Kind != flytev1.ErrorKindSystem {
		t.Fatalf("status %+v; want %d system failures over as many attempts", got.Status, maxSystemFailures+1)
	}
}

func TestPluginErrorsRetryInPlace(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "api-errors", "test-error", nil)
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.SystemFailures != maxSystemFailures+1 || got.Status.Attempts != 1 {
		t.Fatalf("status %+v; want the same attempt retried until the system budget ran out", got.Status)
	}
}

// TestErrorsInPlaceGrantNoUserRetries: a failed call retried in place spends the system
// budget; it must not make room for one more user failure.
func TestErrorsInPlaceGrantNoUserRetries(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "error-then-failure", "test-flaky", map[string]string{"errorsFirst": "1", "failAttempts": "1"})
	ta.Spec.Retries = 0
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Attempts != 1 || got.Status.SystemFailures != 1 || got.Status.UserFailures != 1 {
		t.Fatalf("status %+v; want Failed after one attempt, with one system and one user failure", got.Status)
	}
}

// TestOnlyValidLogLinksAreKept: a link the events service would refuse (no name, not an
// absolute URI) would hold the action's events back; it is left out, the others kept.
func TestOnlyValidLogLinksAreKept(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "links", "test-links", nil)
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	last, _ := got.Status.PhaseHistory.Last()
	if len(last.LogLinks) != 1 || last.LogLinks[0].Name != "good" {
		t.Fatalf("log links %+v; want only the good one", last.LogLinks)
	}
}

func TestDeletionAbortsAndFinalizes(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "long-runner", "test-finalizer", nil)
	create(t, ta)
	waitFor(t, ta, "running with a finalizer", func(a *flytev1.TaskAction) bool {
		return a.Status.Phase == flytev1.PhaseRunning && controllerutil.ContainsFinalizer(a, controller.Finalizer)
	})
	if err := env.Client.Delete(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ta)
	c := calls.get(ta.Name)
	if i := slices.Index(c, "abort"); i < 0 || i+1 >= len(c) || c[i+1] != "finalize" {
		t.Fatalf("plugin calls %v; want abort then finalize", c)
	}
}

func TestTimeout(t *testing.T) {
	ns := env.Namespace(t)
	ta := newAction(ns, "too-slow", "core-sleep", map[string]string{"duration": "1h"})
	ta.Spec.Timeout = &metav1.Duration{Duration: 300 * time.Millisecond}
	create(t, ta)
	got := waitFor(t, ta, "finished", terminal)
	if got.Status.Phase != flytev1.PhaseTimedOut || got.Status.Error == nil || got.Status.Error.Code != "Timeout" {
		t.Fatalf("status %+v", got.Status)
	}
	if took := got.Status.CompletedAt.Sub(got.CreationTimestamp.Time); took > 10*time.Second {
		t.Fatalf("timed out after %s; want about 300ms", took)
	}
}

func findCondition(ta *flytev1.TaskAction, typ string) *metav1.Condition {
	for i := range ta.Status.Conditions {
		if ta.Status.Conditions[i].Type == typ {
			return &ta.Status.Conditions[i]
		}
	}
	return nil
}

// dedupeSteps drops a repeated "handle:N finalize" step (a pass redone after a conflict).
func dedupeSteps(calls []string) []string {
	var out []string
	for i := 0; i < len(calls); i++ {
		n := len(out)
		if i+1 < len(calls) && n >= 2 && out[n-2] == calls[i] && out[n-1] == calls[i+1] {
			i++
			continue
		}
		out = append(out, calls[i])
	}
	return out
}

// Inputs or outputs where the executor's storage.allowedPrefixes let no action go fail
// the action at the first pass that touches them, naming the setting: no retry can
// change the executor's configuration, and the refusal used to come only after the
// system budget.
func TestStorageOutsideTheAllowedPrefixesFailsAtOnce(t *testing.T) {
	ns := env.Namespace(t)
	for i, field := range []string{"spec.runOutputBase", "spec.inputUri"} {
		ta := newAction(ns, fmt.Sprintf("not-allowed-%d", i), "test-echo", nil)
		if field == "spec.runOutputBase" {
			ta.Spec.RunOutputBase = "file:///var/lib/elsewhere/r1"
		} else {
			ta.Spec.InputURI = "file:///var/lib/elsewhere/inputs.json"
		}
		create(t, ta)
		got := waitFor(t, ta, "finished", terminal)
		st := got.Status
		if st.Phase != flytev1.PhaseFailed || st.SystemFailures != 0 || st.Error == nil || st.Error.Code != flytev1.ReasonStorageNotAllowed ||
			!strings.Contains(st.Error.Message, "/var/lib/elsewhere/") || !strings.Contains(st.Error.Message, "storage.allowedPrefixes") {
			t.Fatalf("%s: status %+v; want Failed at once, naming the location and storage.allowedPrefixes", field, st)
		}
		if c := dedupeSteps(slices.Compact(calls.get(ta.Name))); !slices.Equal(c, []string{"handle:1", "abort", "finalize"}) {
			t.Fatalf("%s: plugin calls %v; want one pass, then the attempt let go", field, c)
		}
	}
}
