package sandbox

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// TestVerdict: an example is judged against every expectation its annotations state.
func TestVerdict(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		status      flytev1.TaskActionStatus
		wantDone    bool
		wantProblem bool
	}{
		{"running", map[string]string{annotationExpect: "Succeeded"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseRunning}, false, false},
		{"as expected", map[string]string{annotationExpect: "Succeeded"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded}, true, false},
		{"other phase", map[string]string{annotationExpect: "Succeeded"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseFailed}, true, true},
		{"attempts", map[string]string{annotationExpectAttempts: "2"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, Attempts: 1}, true, true},
		{"cache", map[string]string{annotationExpectCache: "CacheHit"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, CacheStatus: "CacheMiss"}, true, true},
		{"outputs missing", map[string]string{annotationExpectOutputs: "true"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded}, true, true},
		{"outputs written", map[string]string{annotationExpectOutputs: "true"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, OutputsURI: "file:///o/outputs.json"}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &example{applied: true, action: &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Annotations: tt.annotations}, Status: tt.status}}
			done, problem := e.verdict()
			if done != tt.wantDone || (problem != "") != tt.wantProblem {
				t.Fatalf("done %v, problem %q; want done %v, a problem %v", done, problem, tt.wantDone, tt.wantProblem)
			}
		})
	}
}
