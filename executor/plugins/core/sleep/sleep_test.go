package sleep_test

import (
	"context"
	"testing"
	"time"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/plugins/core/sleep"
)

func TestSleep(t *testing.T) {
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		duration  string
		elapsed   []time.Duration // clock at each Handle, after start
		want      []core.Phase
		requeue   time.Duration // of the first call
		errorCode string
		attempt   int32
		config    map[string]string
	}{
		{name: "two seconds", duration: "2s", elapsed: []time.Duration{0, time.Second, 2 * time.Second},
			want: []core.Phase{core.PhaseRunning, core.PhaseRunning, core.PhaseSuccess}, requeue: 2 * time.Second},
		{name: "zero finishes at once", duration: "0s", elapsed: []time.Duration{0}, want: []core.Phase{core.PhaseSuccess}},
		{name: "no duration finishes at once", elapsed: []time.Duration{0}, want: []core.Phase{core.PhaseSuccess}},
		{name: "bad duration", duration: "soon", elapsed: []time.Duration{0}, want: []core.Phase{core.PhasePermanentFailure}, errorCode: "InvalidConfig"},
		{name: "failing attempt", duration: "0s", config: map[string]string{"failAttempts": "2"}, attempt: 2, elapsed: []time.Duration{0},
			want: []core.Phase{core.PhaseRetryableFailure}, errorCode: "SimulatedFailure"},
		{name: "attempt after the failing ones", duration: "0s", config: map[string]string{"failAttempts": "2"}, attempt: 3, elapsed: []time.Duration{0},
			want: []core.Phase{core.PhaseSuccess}},
		{name: "bad failAttempts", config: map[string]string{"failAttempts": "some"}, elapsed: []time.Duration{0},
			want: []core.Phase{core.PhasePermanentFailure}, errorCode: "InvalidConfig"},
		{name: "negative duration", duration: "-1s", elapsed: []time.Duration{0}, want: []core.Phase{core.PhasePermanentFailure}, errorCode: "InvalidConfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{Config: map[string]string{}}}
			for k, v := range tt.config {
				ta.Spec.Config[k] = v
			}
			attempt := max(tt.attempt, 1)
			if tt.duration != "" {
				ta.Spec.Config["duration"] = tt.duration
			}
			p := sleep.Plugin{}
			for i, e := range tt.elapsed {
				now := start.Add(e)
				tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: attempt, Clock: func() time.Time { return now }})
				tr, err := p.Handle(context.Background(), tCtx)
				if err != nil {
					t.Fatal(err)
				}
				if tr.Info.Phase != tt.want[i] {
					t.Fatalf("call %d: phase %s; want %s", i, tr.Info.Phase, tt.want[i])
				}
				if i == 0 && tt.requeue > 0 && tr.Info.RequeueAfter != tt.requeue {
					t.Fatalf("requeue after %s; want %s", tr.Info.RequeueAfter, tt.requeue)
				}
				if tt.errorCode != "" && (tr.Info.Err == nil || tr.Info.Err.Code != tt.errorCode || tr.Info.Err.Kind != core.ErrorKindUser) {
					t.Fatalf("error %+v; want user error %s", tr.Info.Err, tt.errorCode)
				}
			}
		})
	}
}
