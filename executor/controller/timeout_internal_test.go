package controller

import (
	"context"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// A retried attempt's timeout runs from when it started, after its backoff: measured
// from the entry the relaunch wrote, a backoff longer than the timeout timed the new
// attempt out before it ran.
func TestTimeoutStartsAfterTheBackoff(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	next := metav1.NewTime(t0.Add(time.Hour))
	ta := &flytev1.TaskAction{
		Spec: flytev1.TaskActionSpec{Timeout: &metav1.Duration{Duration: 10 * time.Minute}},
		Status: flytev1.TaskActionStatus{Attempts: 2, NextAttemptAt: &next, PhaseHistory: []flytev1.PhaseTransition{
			{Phase: flytev1.PhaseQueued, Attempt: 1, OccurredAt: metav1.NewMicroTime(t0.Add(-time.Minute))},
			{Phase: flytev1.PhaseFailed, Attempt: 1, Version: 1, Reason: flytev1.ReasonAttemptFailed, OccurredAt: metav1.NewMicroTime(t0)},
			{Phase: flytev1.PhaseQueued, Attempt: 2, Reason: flytev1.ReasonRetrying, OccurredAt: metav1.NewMicroTime(t0)},
		}},
	}
	r := &TaskActionReconciler{Clock: clocktesting.NewFakePassiveClock(t0), Log: slog.New(slog.DiscardHandler)}
	for _, tt := range []struct {
		at   time.Time
		want time.Duration
	}{
		{t0.Add(30 * time.Minute), 0},                        // still backing off: the clock has not started
		{t0.Add(time.Hour), 10 * time.Minute},                // the attempt starts
		{t0.Add(time.Hour + 4*time.Minute), 6 * time.Minute}, // and runs
	} {
		s := &scope{r: r, ta: ta, now: metav1.NewTime(tt.at), log: r.Log}
		result, err := s.startAttempt(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		switch next := result.IsZero(); {
		case tt.want == 0 && next:
			t.Fatalf("at %s the attempt started during its backoff", tt.at)
		case tt.want == 0:
			continue
		case !next:
			t.Fatalf("at %s the attempt did not start", tt.at)
		}
		if left := s.timeLeft(); left != tt.want {
			t.Fatalf("at %s, %s of the timeout left; want %s", tt.at.Sub(t0), left, tt.want)
		}
	}
}
