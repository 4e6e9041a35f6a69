package v1_test

import (
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

func entry(attempt, version int32, phase flytev1.Phase) flytev1.PhaseTransition {
	return flytev1.PhaseTransition{Phase: phase, Attempt: attempt, Version: version}
}

func TestPhaseHistoryLast(t *testing.T) {
	tests := []struct {
		name    string
		history flytev1.PhaseHistory
		want    flytev1.HistoryMark
		wantOK  bool
	}{
		{name: "nil"},
		{name: "empty", history: flytev1.PhaseHistory{}},
		{name: "one", history: flytev1.PhaseHistory{entry(1, 0, flytev1.PhaseQueued)}, want: flytev1.HistoryMark{Attempt: 1}, wantOK: true},
		{name: "the newest, a later attempt's", history: flytev1.PhaseHistory{entry(1, 0, flytev1.PhaseQueued), entry(1, 1, flytev1.PhaseRunning), entry(2, 0, flytev1.PhaseQueued)},
			want: flytev1.HistoryMark{Attempt: 2}, wantOK: true},
		{name: "the newest, of one attempt", history: flytev1.PhaseHistory{entry(1, 4, flytev1.PhaseRunning), entry(1, 5, flytev1.PhaseSucceeded)},
			want: flytev1.HistoryMark{Attempt: 1, Version: 5}, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			last, ok := tt.history.Last()
			if ok != tt.wantOK || last.Mark() != tt.want {
				t.Errorf("Last() = %+v, %v; want %+v, %v", last.Mark(), ok, tt.want, tt.wantOK)
			}
			if ok && last.Phase != tt.history[len(tt.history)-1].Phase {
				t.Errorf("Last() is a %s entry; want the last, %s", last.Phase, tt.history[len(tt.history)-1].Phase)
			}
		})
	}
}

func TestPhaseHistoryNextVersion(t *testing.T) {
	tests := []struct {
		name    string
		history flytev1.PhaseHistory
		attempt int32
		want    int32
	}{
		{name: "the first entry", attempt: 1, want: 0},
		{name: "the attempt's second", history: flytev1.PhaseHistory{entry(1, 0, flytev1.PhaseQueued)}, attempt: 1, want: 1},
		{name: "after older entries went", history: flytev1.PhaseHistory{entry(1, 41, flytev1.PhaseRunning)}, attempt: 1, want: 42},
		{name: "a new attempt starts at 0", history: flytev1.PhaseHistory{entry(1, 0, flytev1.PhaseQueued), entry(1, 3, flytev1.PhaseFailed)}, attempt: 2, want: 0},
		{name: "the last entry's attempt decides", history: flytev1.PhaseHistory{entry(1, 7, flytev1.PhaseRunning), entry(2, 2, flytev1.PhaseRunning)}, attempt: 2, want: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.history.NextVersion(tt.attempt); got != tt.want {
				t.Errorf("NextVersion(%d) = %d; want %d", tt.attempt, got, tt.want)
			}
		})
	}
}

func TestHistoryMarkBefore(t *testing.T) {
	mark := func(attempt, version int32) flytev1.HistoryMark {
		return flytev1.HistoryMark{Attempt: attempt, Version: version}
	}
	tests := []struct {
		name string
		m, o flytev1.HistoryMark
		want bool
	}{
		{name: "a lower version", m: mark(1, 0), o: mark(1, 1), want: true},
		{name: "a higher version", m: mark(1, 2), o: mark(1, 1), want: false},
		{name: "the same entry", m: mark(1, 1), o: mark(1, 1), want: false},
		{name: "an earlier attempt, whatever its version", m: mark(1, 9), o: mark(2, 0), want: true},
		{name: "a later attempt, whatever its version", m: mark(2, 0), o: mark(1, 9), want: false},
		{name: "nothing comes before the zero mark", m: mark(1, 0), o: mark(0, 0), want: false},
		{name: "the zero mark comes before every entry", m: mark(0, 0), o: mark(1, 0), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.m.Before(tt.o); got != tt.want {
				t.Errorf("%+v.Before(%+v) = %v; want %v", tt.m, tt.o, got, tt.want)
			}
		})
	}
}

// TestPhasesAreTheCRDs: Phases lists what the CRD's enum admits, in its order.
func TestPhasesAreTheCRDs(t *testing.T) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := env.Client.Get(ctx(t), client.ObjectKey{Name: "taskactions.flyte.org"}, &crd); err != nil {
		t.Fatal(err)
	}
	var enum []flytev1.Phase
	for _, v := range crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["phase"].Enum {
		enum = append(enum, flytev1.Phase(string(v.Raw[1:len(v.Raw)-1]))) // a JSON string
	}
	if !slices.Equal(flytev1.Phases(), enum) {
		t.Errorf("Phases() = %v; the CRD's enum is %v", flytev1.Phases(), enum)
	}
}
