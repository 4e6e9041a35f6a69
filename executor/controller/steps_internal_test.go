package controller

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// lowestNonZeroResult picks the sooner requeue, and a zero result (no requeue) never
// wins over one that asks for a requeue: a running attempt with a timeout but no wait of
// its plugin's is still looked at when the timeout runs out.
func TestLowestNonZeroResult(t *testing.T) {
	none := ctrl.Result{}
	second, minute := ctrl.Result{RequeueAfter: time.Second}, ctrl.Result{RequeueAfter: time.Minute}
	tests := []struct {
		name       string
		i, j, want ctrl.Result
	}{
		{"both zero", none, none, none},
		{"first zero", none, minute, minute},
		{"second zero", second, none, second},
		{"first sooner", second, minute, second},
		{"second sooner", minute, second, second},
		{"equal", minute, minute, minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := lowestNonZeroResult(tt.i, tt.j); got != tt.want {
				t.Fatalf("lowestNonZeroResult(%v, %v) = %v; want %v", tt.i, tt.j, got, tt.want)
			}
		})
	}
}

// runSteps goes on past a step that returns a zero result on an unfinished action, and
// stops at the first that returns an error, a non-zero result or finishes the action,
// returning what it returned.
func TestRunStepsStopsAtTheFirstThatEndsThePass(t *testing.T) {
	failed := errors.New("the API server had a bad moment")
	wait := ctrl.Result{RequeueAfter: time.Second}
	tests := []struct {
		name string
		// second is what the second of three steps does.
		second     func(*scope) (ctrl.Result, error)
		wantRun    []string
		wantResult ctrl.Result
		wantErr    error
	}{
		{"goes on", func(*scope) (ctrl.Result, error) { return ctrl.Result{}, nil }, []string{"1", "2", "3"}, ctrl.Result{}, nil},
		{"waits", func(*scope) (ctrl.Result, error) { return wait, nil }, []string{"1", "2"}, wait, nil},
		{"fails", func(*scope) (ctrl.Result, error) { return ctrl.Result{}, failed }, []string{"1", "2"}, ctrl.Result{}, failed},
		{"finishes the action", func(s *scope) (ctrl.Result, error) {
			s.ta.Status.Phase = flytev1.PhaseSucceeded
			return ctrl.Result{}, nil
		}, []string{"1", "2"}, ctrl.Result{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &scope{ta: &flytev1.TaskAction{}}
			var ran []string
			step := func(name string, do func(*scope) (ctrl.Result, error)) step {
				return func(context.Context) (ctrl.Result, error) {
					ran = append(ran, name)
					return do(s)
				}
			}
			goOn := func(*scope) (ctrl.Result, error) { return ctrl.Result{}, nil }
			result, err := s.runSteps(context.Background(), step("1", goOn), step("2", tt.second), step("3", goOn))
			if !slices.Equal(ran, tt.wantRun) || result != tt.wantResult || !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("ran %v, returned %v, %v; want %v, %v, %v", ran, result, err, tt.wantRun, tt.wantResult, tt.wantErr)
			}
		})
	}
}
