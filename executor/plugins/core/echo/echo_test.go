package echo_test

import (
	"context"
	"os"
	"strings"
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
		// Copied streamed: larger than a document the store reads into memory is fine.
		{name: "inputs larger than a document", inputURI: "mem://b/r1/large.json", inputs: strings.Repeat(" ", 5000) + "{}", want: core.PhaseSuccess,
			outputs: strings.Repeat(" ", 5000) + "{}"},
		{name: "inputs over the copy limit", inputURI: "mem://b/r1/huge.json", inputs: strings.Repeat(" ", 9000) + "{}", want: core.PhasePermanentFailure,
			errorCode: "InputsTooLarge"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// On disk, so that outputs larger than a document are read back whole.
			dir := t.TempDir()
			base := "file://" + dir
			tt.inputURI = strings.Replace(tt.inputURI, "mem://b", base, 1)
			store := datastore.NewLimited(datastore.Limits{MaxDocumentBytes: 1024, MaxCopyBytes: 8192})
			if tt.inputs != "" {
				if err := store.Write(ctx, tt.inputURI, []byte(tt.inputs)); err != nil {
					t.Fatal(err)
				}
			}
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", InputURI: tt.inputURI, RunOutputBase: base + "/r1"}}
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
					if tr.Info.OutputsURI != base+"/r1/a0/1/outputs.json" {
						t.Fatalf("outputs at %s", tr.Info.OutputsURI)
					}
					got, err := os.ReadFile(dir + "/r1/a0/1/outputs.json")
					if err != nil || string(got) != tt.outputs {
						t.Fatalf("outputs %q, %v; want %s", got, err, tt.outputs)
					}
				}
			}
		})
	}
}
