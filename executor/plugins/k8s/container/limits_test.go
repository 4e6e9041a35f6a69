package container_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/plugins/k8s/container"
	"github.com/flytekube/backend/executor/storage"
)

// TestDataOverTheLimitsFailsTheAttempt: what a task leaves over the data store's limits
// (an error document of 64 GiB, sparse; more output files than the bound) fails the
// attempt for good as the user's error, naming the object and the setting, instead of
// being read or erring each pass; an input over the limit is not staged for its pod.
func TestDataOverTheLimitsFailsTheAttempt(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		leave   func(t *testing.T, outputs string) // in the pod's staged output directory
		code    string
		setting string
		object  string // of the attempt's output prefix; "" for the prefix itself
	}{
		{"a sparse 64 GiB error document", func(t *testing.T, outputs string) {
			f, err := os.Create(filepath.Join(outputs, "error.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(f.Truncate(64<<30), f.Close()); err != nil {
				t.Fatal(err)
			}
		}, flytek8s.CodeErrorDocumentTooLarge, datastore.SettingMaxDocumentBytes, "/error.json"},
		{"too many output files", func(t *testing.T, outputs string) {
			for i := range 101 {
				if err := os.WriteFile(filepath.Join(outputs, fmt.Sprintf("f%d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}, flytek8s.CodeOutputsTooLarge, datastore.SettingMaxOutputEntries, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			store, err := datastore.Confine(datastore.NewLimited(datastore.Limits{MaxOutputEntries: 100}), []string{"file://" + dir})
			if err != nil {
				t.Fatal(err)
			}
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "file://" + dir + "/r1",
				Container: &flytev1.ContainerSpec{Image: "busybox"}}}
			ta.UID = "uid"
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store})
			p := container.New(k8s.Config{MountFileStorage: true}, nil)
			obj, err := p.BuildResource(ctx, tCtx)
			if err != nil {
				t.Fatal(err)
			}
			var outputs string
			for _, v := range obj.(*corev1.Pod).Spec.Volumes {
				if v.HostPath != nil && strings.HasSuffix(v.HostPath.Path, "/out") {
					outputs = v.HostPath.Path
				}
			}
			if outputs == "" {
				t.Fatal("the pod mounts no staged output")
			}
			tt.leave(t, outputs)
			pod := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
			info, err := p.GetTaskPhase(ctx, tCtx, &pod)
			if err != nil {
				t.Fatalf("got %v; want a failed attempt", err)
			}
			object := tCtx.OutputWriter().OutputPrefix() + tt.object
			if info.Phase != core.PhasePermanentFailure || info.Err == nil || info.Err.Kind != core.ErrorKindUser || info.Err.Code != tt.code ||
				!strings.Contains(info.Err.Message, tt.setting) || !strings.Contains(info.Err.Message, object) {
				t.Fatalf("got %s %+v; want a permanent user failure %s naming %s and %s", info.Phase, info.Err, tt.code, object, tt.setting)
			}
		})
	}

	t.Run("a sparse 64 GiB input", func(t *testing.T) {
		dir := t.TempDir()
		f, err := os.Create(filepath.Join(dir, "inputs.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(f.Truncate(64<<30), f.Close()); err != nil {
			t.Fatal(err)
		}
		store, err := datastore.Confine(datastore.New(), []string{"file://" + dir})
		if err != nil {
			t.Fatal(err)
		}
		ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "file://" + dir + "/r1",
			InputURI: "file://" + dir + "/inputs.json", Container: &flytev1.ContainerSpec{Image: "busybox"}}}
		ta.UID = "uid"
		tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store})
		obj, err := container.New(k8s.Config{MountFileStorage: true}, nil).BuildResource(ctx, tCtx)
		if !errors.Is(err, storage.ErrTooLarge) || core.IsTransient(err) || !strings.Contains(err.Error(), datastore.SettingMaxCopyBytes) {
			t.Fatalf("built %v, %v; want a permanent error naming %s", obj, err, datastore.SettingMaxCopyBytes)
		}
	})
}
