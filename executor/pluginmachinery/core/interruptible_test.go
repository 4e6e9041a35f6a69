package core_test

import (
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// TestInterruptiblePolicy: an interruptible action's attempts run on preemptible
// capacity until it has had k8s.interruptibleFailureThreshold system failures (or, for a
// negative threshold -N, maxSystemFailures less N), then on on-demand capacity, and the
// policy says why.
func TestInterruptiblePolicy(t *testing.T) {
	for _, tt := range []struct {
		name                   string
		interruptible          bool
		systemFailures         int32
		threshold, maxFailures int32
		want                   bool
		wantWhy                string
	}{
		{name: "not interruptible", interruptible: false, threshold: 1, maxFailures: 3},
		{name: "not interruptible, threshold off", interruptible: false, systemFailures: 2, maxFailures: 3},
		{name: "threshold off", interruptible: true, systemFailures: 3, maxFailures: 3, want: true},
		{name: "below a positive threshold", interruptible: true, systemFailures: 1, threshold: 2, maxFailures: 3, want: true},
		{name: "at a positive threshold", interruptible: true, systemFailures: 2, threshold: 2, maxFailures: 3,
			wantWhy: "runs on on-demand capacity: 2 system failures reached k8s.interruptibleFailureThreshold 2"},
		{name: "past a positive threshold", interruptible: true, systemFailures: 3, threshold: 2, maxFailures: 3,
			wantWhy: "runs on on-demand capacity: 3 system failures reached k8s.interruptibleFailureThreshold 2"},
		{name: "threshold 1, first failure", interruptible: true, systemFailures: 1, threshold: 1, maxFailures: 3,
			wantWhy: "runs on on-demand capacity: 1 system failure reached k8s.interruptibleFailureThreshold 1"},
		{name: "threshold 1, no failure yet", interruptible: true, threshold: 1, maxFailures: 3, want: true},
		// -1 with a budget of 3: interruptible while fewer than 3 - 1 = 2 failures.
		{name: "below a negative threshold", interruptible: true, systemFailures: 1, threshold: -1, maxFailures: 3, want: true},
		{name: "at a negative threshold", interruptible: true, systemFailures: 2, threshold: -1, maxFailures: 3,
			wantWhy: "runs on on-demand capacity: 2 system failures reached k8s.interruptibleFailureThreshold -1 (maxSystemFailures 3 less 1)"},
		{name: "the last of the budget", interruptible: true, systemFailures: 3, threshold: -1, maxFailures: 3,
			wantWhy: "runs on on-demand capacity: 3 system failures reached k8s.interruptibleFailureThreshold -1 (maxSystemFailures 3 less 1)"},
		{name: "a negative threshold of the whole budget", interruptible: true, threshold: -3, maxFailures: 3,
			wantWhy: "runs on on-demand capacity: 0 system failures reached k8s.interruptibleFailureThreshold -3 (maxSystemFailures 3 less 3)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{
				Spec:   flytev1.TaskActionSpec{Interruptible: tt.interruptible},
				Status: flytev1.TaskActionStatus{SystemFailures: tt.systemFailures},
			}
			p := core.InterruptiblePolicy{FailureThreshold: tt.threshold, MaxSystemFailures: tt.maxFailures}
			got, why := p.Decide(ta)
			if got != tt.want || why != tt.wantWhy {
				t.Errorf("Decide() = %v, %q; want %v, %q", got, why, tt.want, tt.wantWhy)
			}
		})
	}
}

// The metadata a plugin gets says whether its attempt is interruptible, by the policy
// the controller passes in, and counts the system failures the action has when asked.
func TestMetadataIsInterruptible(t *testing.T) {
	ta := action()
	ta.Spec.Interruptible = true
	md := core.NewTaskExecutionContext(core.ExecutionContextOptions{
		Action: ta, Attempt: 1, Interruptible: core.InterruptiblePolicy{FailureThreshold: 1, MaxSystemFailures: 3},
	}).Metadata()
	if !md.IsInterruptible() {
		t.Fatal("IsInterruptible() = false before any system failure")
	}
	ta.Status.SystemFailures = 1
	if md.IsInterruptible() {
		t.Fatal("IsInterruptible() = true after the threshold's system failure")
	}
	// Without a policy (threshold 0) the action's own wish holds.
	plain := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 2}).Metadata()
	if !plain.IsInterruptible() {
		t.Fatal("IsInterruptible() = false without a threshold")
	}
}
