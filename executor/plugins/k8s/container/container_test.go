package container_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/plugins/k8s/container"
)

func terminated(code int32, reason string) []corev1.ContainerStatus {
	return []corev1.ContainerStatus{{Name: flytek8s.ContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}}
}

// now is the tests' clock.
var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// waiting is a pod created age ago whose container waits for reason.
func waiting(age time.Duration, reason string) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-age))},
		Spec: corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: flytek8s.ContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "the image is not there"}}}}}}
}

func TestGetTaskPhase(t *testing.T) {
	ctx := context.Background()
	deleting := metav1.NewTime(time.Now())
	tests := []struct {
		name       string
		pod        corev1.Pod
		files      map[string]string // written to the data store first
		wantPhase  core.Phase
		wantReason string
		wantCode   string
		wantKind   core.ErrorKind
		wantOut    string
	}{
		{name: "pending, not yet on a node", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}},
			wantPhase: core.PhaseQueued, wantReason: "ObjectCreated"},
		{name: "pending on a node", pod: corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{Phase: corev1.PodPending}},
			wantPhase: core.PhaseInitializing, wantReason: "Pending"},
		{name: "unschedulable", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes are available"}}}},
			wantPhase: core.PhaseWaitingForResources, wantReason: "Unschedulable"},
		{name: "image pull backoff within the grace period", pod: waiting(10*time.Second, "ImagePullBackOff"),
			wantPhase: core.PhaseInitializing, wantReason: "ImagePullBackOff"},
		{name: "image pulls failing past the grace period", pod: waiting(2*time.Minute, "ErrImagePull"),
			wantPhase: core.PhasePermanentFailure, wantCode: "ImagePullFailed", wantKind: core.ErrorKindUser},
		{name: "a name that cannot be an image", pod: waiting(time.Second, "InvalidImageName"),
			wantPhase: core.PhasePermanentFailure, wantCode: "ImagePullFailed", wantKind: core.ErrorKindUser},
		{name: "running", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}, wantPhase: core.PhaseRunning, wantReason: "Running"},
		{name: "terminating", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			wantPhase: core.PhaseRunning, wantReason: "Terminating"},
		{name: "preempted", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}}},
			wantPhase: core.PhaseRunning, wantReason: "Preempted"},
		{name: "finished while terminating counts as finished", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting},
			Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}, wantPhase: core.PhaseSuccess},
		{name: "succeeded with outputs", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
			files: map[string]string{"mem://out/r1/a0/1/outputs.json": `{"y": 1}`}, wantPhase: core.PhaseSuccess, wantOut: "mem://out/r1/a0/1/outputs.json"},
		{name: "succeeded but wrote an error document", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
			files:     map[string]string{"mem://out/r1/a0/1/error.json": `{"code": "BadInput", "message": "x must be positive"}`},
			wantPhase: core.PhaseRetryableFailure, wantCode: "BadInput", wantKind: core.ErrorKindUser},
		{name: "exit code", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated(3, "Error")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "ExitCode3", wantKind: core.ErrorKindUser},
		{name: "out of memory", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated(137, "OOMKilled")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "OOMKilled", wantKind: core.ErrorKindUser},
		{name: "killed by SIGKILL, nothing stopping the pod", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated(137, "Error")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "KilledBySIGKILL", wantKind: core.ErrorKindUser},
		{name: "out of memory while being deleted", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting},
			Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated(137, "OOMKilled")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "OOMKilled", wantKind: core.ErrorKindUser},
		{name: "exited 0, yet the pod failed", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded",
			ContainerStatuses: terminated(0, "Completed")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "DeadlineExceeded", wantKind: core.ErrorKindSystem},
		{name: "failed before the container ran", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "PodFailed", wantKind: core.ErrorKindSystem},
		{name: "stopped by its deletion (the kubelet marks it Failed, exit 143)", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting},
			Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated(143, "Error")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "Terminating", wantKind: core.ErrorKindSystem},
		{name: "preempted and stopped", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting},
			Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: terminated(137, "Error"),
				Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}}}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "Preempted", wantKind: core.ErrorKindSystem},
		{name: "evicted while running", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted",
			ContainerStatuses: terminated(137, "Error")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "Evicted", wantKind: core.ErrorKindSystem},
		{name: "node shutdown", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Terminated",
			Message: "Pod was terminated in response to imminent node shutdown.", ContainerStatuses: terminated(143, "Error")}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "Terminated", wantKind: core.ErrorKindSystem},
		{name: "evicted before the container ran", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted"}},
			wantPhase: core.PhaseRetryableFailure, wantCode: "Evicted", wantKind: core.ErrorKindSystem},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := datastore.New()
			for uri, content := range tt.files {
				if err := store.Write(ctx, uri, []byte(content)); err != nil {
					t.Fatal(err)
				}
			}
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "mem://out/r1"}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store,
				Clock: func() time.Time { return now }})
			pod := tt.pod
			info, err := container.New(k8s.Config{ImagePullGracePeriod: metav1.Duration{Duration: time.Minute}}, nil).GetTaskPhase(ctx, tCtx, &pod)
			if err != nil {
				t.Fatal(err)
			}
			if info.Phase != tt.wantPhase || (tt.wantReason != "" && info.Reason != tt.wantReason) || info.OutputsURI != tt.wantOut {
				t.Fatalf("got %s/%s (outputs %q); want %s/%s (%q)", info.Phase, info.Reason, info.OutputsURI, tt.wantPhase, tt.wantReason, tt.wantOut)
			}
			if tt.wantCode != "" && (info.Err == nil || info.Err.Code != tt.wantCode || info.Err.Kind != tt.wantKind) {
				t.Fatalf("error %+v; want %s of kind %d", info.Err, tt.wantCode, tt.wantKind)
			}
		})
	}
}

// TestMountFileStorage: with k8s.mountFileStorage, a pod gets the action's file:// input
// read-only and its attempt's output directory, at the paths the URIs name, both staged
// for the attempt (their host paths are in its staging directory); without it, or for
// data elsewhere, nothing of the host is mounted.
func TestMountFileStorage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "inputs.json"), []byte(`{"x": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	store, err := datastore.Confine(datastore.New(), []string{"file://" + dir, "mem://out/"})
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(dir, datastore.StagingDir, "uid-2")
	input := corev1.VolumeMount{Name: flytek8s.InputsVolume, MountPath: filepath.Join(dir, "inputs.json"), ReadOnly: true}
	output := corev1.VolumeMount{Name: flytek8s.OutputsVolume, MountPath: filepath.Join(dir, "r1/a0/2")}
	tests := []struct {
		name        string
		mount       bool
		input, base string
		want        map[string]string // volume name: host path
		wantMounts  []corev1.VolumeMount
		wantErr     bool
	}{
		{name: "off", input: "file://" + dir + "/inputs.json", base: "file://" + dir + "/r1", want: map[string]string{}},
		{name: "on", mount: true, input: "file://" + dir + "/inputs.json", base: "file://" + dir + "/r1",
			want:       map[string]string{flytek8s.InputsVolume: filepath.Join(staging, "in/inputs.json"), flytek8s.OutputsVolume: filepath.Join(staging, "out")},
			wantMounts: []corev1.VolumeMount{input, output}},
		{name: "on, no inputs", mount: true, base: "file://" + dir + "/r1",
			want: map[string]string{flytek8s.OutputsVolume: filepath.Join(staging, "out")}, wantMounts: []corev1.VolumeMount{output}},
		{name: "on, data elsewhere", mount: true, base: "mem://out/r1", want: map[string]string{}},
		{name: "on, input missing", mount: true, input: "file://" + dir + "/missing.json", base: "file://" + dir + "/r1", wantErr: true},
		{name: "on, outside the prefixes", mount: true, base: "file:///etc/r1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{UID: "uid"}, Spec: flytev1.TaskActionSpec{ActionName: "a0", InputURI: tt.input, RunOutputBase: tt.base,
				Container: &flytev1.ContainerSpec{Image: "busybox"}}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 2, DataStore: store})
			obj, err := container.New(k8s.Config{MountFileStorage: tt.mount}, nil).BuildResource(ctx, tCtx)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("built %+v", obj)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			spec := obj.(*corev1.Pod).Spec
			got := map[string]string{}
			for _, v := range spec.Volumes {
				got[v.Name] = v.HostPath.Path
			}
			if !maps.Equal(got, tt.want) || !reflect.DeepEqual(spec.Containers[0].VolumeMounts, tt.wantMounts) {
				t.Fatalf("volumes %v, mounts %+v; want %v, %+v", got, spec.Containers[0].VolumeMounts, tt.want, tt.wantMounts)
			}
			for _, path := range got {
				if _, err := os.Stat(path); err != nil {
					t.Fatalf("%s was not staged: %v", path, err)
				}
			}
		})
	}
}
