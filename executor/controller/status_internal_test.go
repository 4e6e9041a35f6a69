package controller

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// recordPhase adds a history entry whenever there is something new to report: another
// phase, a new version of the plugin's phase, or Kubernetes events read with a change of
// the plugin's phase that keeps the action's (they would be lost otherwise, since the
// next read starts after them).
func TestRecordPhaseRecordsWhatIsNew(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	event := []flytev1.ClusterEvent{{OccurredAt: now, Object: "Pod/a-1", Type: "Warning", Reason: "FailedScheduling"}}
	tests := []struct {
		name       string
		phase      flytev1.Phase
		newVersion bool
		events     []flytev1.ClusterEvent
		want       bool
	}{
		{"the same phase, nothing new", flytev1.PhaseWaitingForResources, false, nil, false},
		{"another phase", flytev1.PhaseRunning, false, nil, true},
		{"a new version of the plugin's phase", flytev1.PhaseWaitingForResources, true, nil, true},
		{"the same phase with cluster events", flytev1.PhaseWaitingForResources, false, event, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{Status: flytev1.TaskActionStatus{Phase: flytev1.PhaseWaitingForResources, Attempts: 1,
				PhaseHistory: []flytev1.PhaseTransition{{Phase: flytev1.PhaseWaitingForResources, Attempt: 1}}}}
			got := recordPhase(ta, tt.phase, "Reason", "", now, tt.newVersion, nil, tt.events)
			if got != tt.want || len(ta.Status.PhaseHistory) != map[bool]int{false: 1, true: 2}[tt.want] {
				t.Fatalf("recordPhase = %v with %d entries; want %v", got, len(ta.Status.PhaseHistory), tt.want)
			}
			if tt.want {
				last := ta.Status.PhaseHistory[1]
				if len(last.ClusterEvents) != len(tt.events) || (last.Phase == ta.Status.PhaseHistory[0].Phase && last.Version != 1) {
					t.Fatalf("new entry %+v", last)
				}
			}
		})
	}
}

// An action held for the events backlog is Queued before its history begins: when it
// starts, its first Queued entry is written all the same, so that its events begin with
// it.
func TestRecordPhaseWritesTheFirstEntryOfAHeldAction(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	ta := &flytev1.TaskAction{Status: flytev1.TaskActionStatus{Phase: flytev1.PhaseQueued, Attempts: 1}}
	setConditions(ta, flytev1.PhaseQueued, flytev1.ReasonEventsBacklog, "waiting to start", now)
	if !recordPhase(ta, flytev1.PhaseQueued, flytev1.ReasonQueued, "", now, false, nil, nil) || len(ta.Status.PhaseHistory) != 1 {
		t.Fatalf("the held action's first Queued entry was not written: history %+v", ta.Status.PhaseHistory)
	}
	if c := ta.Status.Conditions[0]; c.Reason != flytev1.ReasonQueued {
		t.Fatalf("Progressing condition %+v; want reason %s once it starts", c, flytev1.ReasonQueued)
	}
}

// Past the history's cap every entry still gets a version of its own, one after the
// attempt's last: numbering by counting the entries left would give each new entry the
// same version from the 201st on, and the events service would take them for one event.
func TestHistoryVersionsGrowPastTheCap(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	ta := &flytev1.TaskAction{Status: flytev1.TaskActionStatus{Attempts: 1}}
	phases := []flytev1.Phase{flytev1.PhaseWaitingForResources, flytev1.PhaseInitializing}
	seen := map[int32]bool{}
	for i := range 3 * maxPhaseHistory {
		recordPhase(ta, phases[i%2], "Reason", "", now, false, nil, nil)
		last, _ := ta.Status.PhaseHistory.Last()
		if seen[last.Version] {
			t.Fatalf("entry %d got version %d again", i, last.Version)
		}
		seen[last.Version] = true
	}
	if n := len(ta.Status.PhaseHistory); n != maxPhaseHistory {
		t.Fatalf("%d entries; want the cap, %d", n, maxPhaseHistory)
	}
	ta.Status.Attempts = 2
	recordPhase(ta, flytev1.PhaseQueued, flytev1.ReasonRetrying, "", now, false, nil, nil)
	if last, _ := ta.Status.PhaseHistory.Last(); last.Attempt != 2 || last.Version != 0 {
		t.Fatalf("a new attempt's first entry is %d/%d; want 2/0", last.Attempt, last.Version)
	}
}

// A wait refused again and again costs one entry, with a count, and each repeat still
// has a new version (so it reaches the events service); anything that differs is an
// entry of its own.
func TestRepeatedWaitsFoldIntoOneEntry(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	event := []flytev1.ClusterEvent{{OccurredAt: now, Object: "Pod/a-1", Type: "Warning", Reason: "FailedScheduling"}}
	tests := []struct {
		name    string
		reason  string
		events  []flytev1.ClusterEvent
		entries int
		count   int32
	}{
		{"the same reason", "ExceededQuota", nil, 2, 1000},
		{"another reason", "Other", nil, 3, 0},
		{"with cluster events", "ExceededQuota", event, 3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{Status: flytev1.TaskActionStatus{Attempts: 1}}
			recordPhase(ta, flytev1.PhaseQueued, flytev1.ReasonQueued, "", now, false, nil, nil)
			recordPhase(ta, flytev1.PhaseWaitingForResources, "ExceededQuota", "refused 1", now, true, nil, nil)
			for i := 2; i <= 1000; i++ {
				recordPhase(ta, flytev1.PhaseWaitingForResources, tt.reason, fmt.Sprintf("refused %d", i), now, true, nil, tt.events)
			}
			h := ta.Status.PhaseHistory
			if tt.count == 0 {
				if len(h) < tt.entries {
					t.Fatalf("%d entries; want each kept", len(h))
				}
				return
			}
			if len(h) != tt.entries || h[1].Count != tt.count || h[1].Version != 1000 || h[1].Message != "refused 1000" {
				t.Fatalf("history %+v; want Queued and one wait counted %d times, version 1000, the newest message", h, tt.count)
			}
		})
	}
}
