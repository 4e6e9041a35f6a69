package container_test

import (
	"context"
	"strings"
	"testing"

	"gocloud.dev/gcerrors"
	corev1 "k8s.io/api/core/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/datastore/storetest"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/plugins/k8s/container"
)

var faulty = storetest.Register("faulty")

// TestOutcomeNeverSucceedsOnAStoreError: a succeeded pod's outcome is what the store
// says, and only that. Outputs that exist make a success with them, absent ones a
// success without (a task may have none); an error is never taken for either: a store's
// bad moment is a transient error (the pass runs again, uncharged), anything else an
// error of its own.
func TestOutcomeNeverSucceedsOnAStoreError(t *testing.T) {
	ctx := context.Background()
	const prefix = "faulty://out/r1/a0/1/"
	tests := []struct {
		name          string
		outputs       bool // the task wrote its outputs
		op            storetest.Op
		file          string
		code          gcerrors.ErrorCode
		wantOut       string
		wantErr       bool
		wantTransient bool
	}{
		{name: "outputs written", outputs: true, wantOut: prefix + "outputs.json"},
		{name: "no outputs", wantOut: ""},
		{name: "outputs written, store deadline", outputs: true, op: storetest.OpExists, file: "outputs.json", code: gcerrors.DeadlineExceeded, wantErr: true, wantTransient: true},
		{name: "no outputs, store throttled", op: storetest.OpExists, file: "outputs.json", code: gcerrors.ResourceExhausted, wantErr: true, wantTransient: true},
		{name: "outputs written, permission denied", outputs: true, op: storetest.OpExists, file: "outputs.json", code: gcerrors.PermissionDenied, wantErr: true},
		{name: "error document unreadable, internal", outputs: true, op: storetest.OpRead, file: "error.json", code: gcerrors.Internal, wantErr: true, wantTransient: true},
		{name: "error document unreadable, invalid argument", outputs: true, op: storetest.OpRead, file: "error.json", code: gcerrors.InvalidArgument, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Cleanup(faulty.Clear)
			_ = faulty.Real("out").Delete(ctx, "r1/a0/1/outputs.json")
			if tt.outputs {
				if err := faulty.Real("out").WriteAll(ctx, "r1/a0/1/outputs.json", []byte(`{"y": 1}`), nil); err != nil {
					t.Fatal(err)
				}
			}
			if tt.op != "" {
				faulty.Fail(tt.op, tt.file, tt.code, -1)
			}
			store, err := datastore.Confine(datastore.New(), nil)
			if err != nil {
				t.Fatal(err)
			}
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "faulty://out/r1"}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store})
			pod := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
			info, err := container.New(k8s.Config{}, nil).GetTaskPhase(ctx, tCtx, &pod)
			switch {
			case tt.wantErr && err == nil:
				t.Fatalf("got %s (outputs %q); want an error", info.Phase, info.OutputsURI)
			case tt.wantErr && core.IsTransient(err) != tt.wantTransient:
				t.Fatalf("error %v: transient %v; want %v", err, core.IsTransient(err), tt.wantTransient)
			case tt.wantErr:
				return
			case err != nil:
				t.Fatal(err)
			case info.Phase != core.PhaseSuccess || info.OutputsURI != tt.wantOut:
				t.Fatalf("got %s (outputs %q); want success with %q", info.Phase, info.OutputsURI, tt.wantOut)
			}
		})
	}
}

// TestRefusedOutputBase: an output base the data store refuses (file:// with
// storage.allowedPrefixes empty) fails the pod's build, naming the setting, and a
// succeeded pod whose outcome lies there fails for good instead of erring each pass.
func TestRefusedOutputBase(t *testing.T) {
	ctx := context.Background()
	store, err := datastore.Confine(datastore.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "file://" + t.TempDir() + "/r1",
		Container: &flytev1.ContainerSpec{Image: "busybox"}}}
	tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store})
	p := container.New(k8s.Config{}, nil)
	if obj, err := p.BuildResource(ctx, tCtx); err == nil || !strings.Contains(err.Error(), "storage.allowedPrefixes") {
		t.Fatalf("built %v, %v; want an error naming storage.allowedPrefixes", obj, err)
	}
	pod := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
	info, err := p.GetTaskPhase(ctx, tCtx, &pod)
	if err != nil || info.Phase != core.PhasePermanentFailure || info.Err == nil || info.Err.Code != "OutputsNotAllowed" ||
		!strings.Contains(info.Err.Message, "storage.allowedPrefixes") {
		t.Fatalf("got %+v, %v; want a permanent OutputsNotAllowed naming storage.allowedPrefixes", info, err)
	}
}
