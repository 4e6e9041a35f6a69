package echo_test

import (
	"context"
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/plugins/core/echo"
)

func TestEcho(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		inputURI  string
		inputs    string // written first when not empty
		want      core.Phase
		outputs   string
		errorCode string
	}{
		{name: "copies inputs", inputURI: "mem://b/r1/inputs.json", inputs: `{"x":[1,2]}`, want: core.PhaseSuccess, outputs: `{"x":[1,2]}`},
		{name: "no inputs: empty outputs", want: core.PhaseSuccess, outputs: `{}`},
		{name: "missing inputs", inputURI: "mem://b/r1/missing.json", want: core.PhasePermanentFailure, errorCode: "InputsNotFound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := datastore.New()
			if tt.inputs != "" {
				if err := store.Write(ctx, tt.inputURI, []byte(tt.inputs)); err != nil {
					t.Fatal(err)
				}
			}
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", InputURI: tt.inputURI, RunOutputBase: "mem://b/r1"}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store})
			for range 2 { // idempotent
				tr, err := echo.Plugin{}.Handle(ctx, tCtx)
				if err != nil {
					t.Fatal(err)
				}
				if tr.Info.Phase != tt.want {
					t.Fatalf("phase %s; want %s", tr.Info.Phase, tt.want)
				}
				if tt.errorCode != "" && (tr.Info.Err == nil || tr.Info.Err.Code != tt.errorCode) {
					t.Fatalf("error %+v; want %s", tr.Info.Err, tt.errorCode)
				}
				if tt.outputs != "" {
					if tr.Info.OutputsURI != "mem://b/r1/a0/1/outputs.json" {
						t.Fatalf("outputs at %s", tr.Info.OutputsURI)
					}
					got, err := store.Read(ctx, tr.Info.OutputsURI)
					if err != nil || string(got) != tt.outputs {
						t.Fatalf("outputs %q, %v; want %s", got, err, tt.outputs)
					}
				}
			}
		})
	}
}
