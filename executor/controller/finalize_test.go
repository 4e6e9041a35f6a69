package controller_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/test/eventually"
)

// The one policy for a plugin's Finalize errors (failures.go): the outcome that needed
// the release waits; while the action runs, each error is a system failure and the pass
// runs again after the backoff; once the system budget is spent the action fails with
// SystemError and the release is logged, not waited for. A user failure is counted only
// by the pass whose release succeeds.
func TestFinalizeErrorsAreSystemFailures(t *testing.T) {
	// A pass whose Finalize fails: the attempt is handled, the release fails.
	failedPass := []string{"handle:1", "finalize:error"}
	// The pass that spends the system budget also aborts, and its release fails again.
	budgetSpent := slices.Concat(slices.Repeat(failedPass, maxSystemFailures+1), []string{"abort", "finalize:error"})
	tests := []struct {
		name                           string
		failAttempts, finalizeFailures int
		retries                        int32
		wantPhase                      flytev1.Phase
		wantAttempts                   int32
		wantUser, wantSystem           int32
		// wantHistory is phase/reason@attempt, with the error code of entries that carry one.
		wantHistory string
		wantCalls   []string
	}{{
		name:             "success waits for its release",
		finalizeFailures: 2,
		wantPhase:        flytev1.PhaseSucceeded, wantAttempts: 1, wantUser: 0, wantSystem: 2,
		wantHistory: "Queued/Queued@1 Succeeded/Succeeded@1",
		wantCalls:   slices.Concat(failedPass, failedPass, []string{"handle:1", "finalize"}),
	}, {
		name:         "user failure is counted once, by the pass that released it",
		failAttempts: 1, finalizeFailures: 1, retries: 1,
		wantPhase: flytev1.PhaseSucceeded, wantAttempts: 2, wantUser: 1, wantSystem: 1,
		// The retry is the user failure's, not the Finalize error's.
		wantHistory: "Queued/Queued@1 Failed/AttemptFailed@1(ExitCode1) Queued/Retrying@2 Succeeded/Succeeded@2",
		wantCalls:   slices.Concat(failedPass, []string{"handle:1", "finalize", "handle:2", "finalize"}),
	}, {
		name:             "success whose release never succeeds fails once the budget is spent",
		finalizeFailures: 1000,
		wantPhase:        flytev1.PhaseFailed, wantAttempts: 1, wantUser: 0, wantSystem: maxSystemFailures + 1,
		wantHistory: "Queued/Queued@1 Failed/SystemError@1(FinalizeFailed)",
		wantCalls:   budgetSpent,
	}, {
		name:         "user failure whose release never succeeds fails once the budget is spent",
		failAttempts: 1, finalizeFailures: 1000, retries: 1,
		wantPhase: flytev1.PhaseFailed, wantAttempts: 1, wantUser: 0, wantSystem: maxSystemFailures + 1,
		wantHistory: "Queued/Queued@1 Failed/SystemError@1(FinalizeFailed)",
		wantCalls:   budgetSpent,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			ta := newAction(ns, fmt.Sprintf("finalize-fails-%d", i), "test-finalize-fails", map[string]string{
				"failAttempts": strconv.Itoa(tt.failAttempts), "finalizeFailures": strconv.Itoa(tt.finalizeFailures)})
			ta.Spec.RunName = "finalize-" + ns[len(ns)-6:]
			ta.Spec.Retries = tt.retries
			// The call log is by action name, which a repeated run (-count) reuses.
			seen := len(calls.get(ta.Name))
			create(t, ta)
			// terminal: the outcome is written and the finalizer is off; the budget's
			// release did not hold the action.
			got := waitFor(t, ta, "finished", terminal)

			st := got.Status
			if st.Phase != tt.wantPhase || st.Attempts != tt.wantAttempts || st.UserFailures != tt.wantUser || st.SystemFailures != tt.wantSystem {
				t.Fatalf("phase %s, attempts %d, user failures %d, system failures %d; want %s, %d, %d, %d (status %+v)",
					st.Phase, st.Attempts, st.UserFailures, st.SystemFailures, tt.wantPhase, tt.wantAttempts, tt.wantUser, tt.wantSystem, st)
			}
			if h := historyWithErrors(got); h != tt.wantHistory {
				t.Fatalf("phase history %s; want %s", h, tt.wantHistory)
			}
			if c := calls.get(ta.Name)[seen:]; !slices.Equal(c, tt.wantCalls) {
				t.Fatalf("plugin calls %v; want %v", c, tt.wantCalls)
			}
			switch tt.wantPhase {
			case flytev1.PhaseSucceeded:
				if st.Error != nil {
					t.Fatalf("succeeded with error %+v", st.Error)
				}
			case flytev1.PhaseFailed:
				if st.Error == nil || st.Error.Kind != flytev1.ErrorKindSystem || st.Error.Code != "FinalizeFailed" ||
					!strings.Contains(st.Error.Message, "finalizing attempt 1") {
					t.Fatalf("error %+v; want the Finalize error, a system one", st.Error)
				}
				if c := findCondition(got, flytev1.ConditionFailed); c == nil || c.Reason != flytev1.ReasonSystemError {
					t.Fatalf("failed condition %+v; want reason %s", c, flytev1.ReasonSystemError)
				}
				if took := st.CompletedAt.Sub(got.CreationTimestamp.Time); took > 10*time.Second {
					t.Fatalf("failed after %s; want the backoffs of %d system failures (well under a second)", took, maxSystemFailures)
				}
			}

			got = waitFor(t, ta, "delivered", delivered)
			eventsMatchHistory(t, storedEvents(t, got), got)
		})
	}
}

// TestDeletionWaitsForFinalize: a deleted action is kept until its plugin lets go, past
// the system budget, which does not apply to a deletion; then it is recorded Aborted.
func TestDeletionWaitsForFinalize(t *testing.T) {
	ns := env.Namespace(t)
	failures := maxSystemFailures + 2
	ta := newAction(ns, "finalize-fails-deleted", "test-finalize-fails", map[string]string{
		"running": "true", "finalizeFailures": strconv.Itoa(failures)})
	ta.Spec.RunName = "finalize-deleted-" + ns[len(ns)-6:]
	seen := len(calls.get(ta.Name))
	create(t, ta)
	running := waitFor(t, ta, "running with a finalizer", func(a *flytev1.TaskAction) bool {
		return a.Status.Phase == flytev1.PhaseRunning && controllerutil.ContainsFinalizer(a, controller.Finalizer)
	})
	if err := env.Client.Delete(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, func() bool {
		return apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &flytev1.TaskAction{}))
	}, func() string {
		return fmt.Sprintf("the deleted action was never released; plugin calls %v", calls.get(ta.Name)[seen:])
	})

	// Every failed Finalize was retried, each after an Abort, until one succeeded; a
	// pass redone after a write conflict may repeat the release that succeeded.
	c := calls.get(ta.Name)[seen:]
	release := slices.DeleteFunc(slices.Clone(c), func(s string) bool { return strings.HasPrefix(s, "handle:") })
	want := slices.Concat(slices.Repeat([]string{"abort", "finalize:error"}, failures), []string{"abort", "finalize"})
	if len(release) < len(want) || !slices.Equal(release[:len(want)], want) || slices.Contains(release[len(want):], "finalize:error") {
		t.Fatalf("plugin calls %v; want %d failed releases, then one that succeeded", c, failures)
	}
	evs := storedEvents(t, running)
	if last := evs[len(evs)-1]; last.GetPhase() != flytecorev1.ActionPhase_ACTION_PHASE_ABORTED {
		t.Fatalf("last event %v; want ABORTED", last)
	}
}

// historyWithErrors is history with the error code of each entry that carries one.
func historyWithErrors(ta *flytev1.TaskAction) string {
	var parts []string
	for _, h := range ta.Status.PhaseHistory {
		part := fmt.Sprintf("%s/%s@%d", h.Phase, h.Reason, h.Attempt)
		if h.Error != nil {
			part += "(" + h.Error.Code + ")"
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, " ")
}

// eventPhase is the events service's name of a phase, derived from its name rather than
// copied from the publisher's table so that a wrong entry there shows: "WaitingForResources"
// is ACTION_PHASE_WAITING_FOR_RESOURCES, and a phase with no such value is UNSPECIFIED.
func eventPhase(p flytev1.Phase) flytecorev1.ActionPhase {
	words := regexp.MustCompile(`([a-z])([A-Z])`).ReplaceAllString(string(p), "${1}_${2}")
	return flytecorev1.ActionPhase(flytecorev1.ActionPhase_value["ACTION_PHASE_"+strings.ToUpper(words)])
}

// eventsMatchHistory checks that the events service holds one event per history entry
// of a delivered action, each as the entry says.
func eventsMatchHistory(t *testing.T, evs []*eventsv1.ActionEvent, ta *flytev1.TaskAction) {
	t.Helper()
	if len(evs) != len(ta.Status.PhaseHistory) {
		t.Fatalf("%d events stored; want one per history entry (%s)", len(evs), historyWithErrors(ta))
	}
	for i, h := range ta.Status.PhaseHistory {
		e := evs[i]
		wantCode := ""
		if h.Error != nil {
			wantCode = h.Error.Code
		}
		if e.GetPhase() != eventPhase(h.Phase) || e.GetAttempt() != uint32(h.Attempt) || e.GetVersion() != uint32(h.Version) ||
			e.GetReason() != h.Reason || e.GetError().GetCode() != wantCode {
			t.Fatalf("event %d = %v; history entry %+v", i, e, h)
		}
	}
}
