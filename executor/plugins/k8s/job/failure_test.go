package job

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// podLister serves a fixed list of pods, whatever is asked.
type podLister struct {
	client.Reader
	pods []corev1.Pod
}

func (l podLister) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	list.(*corev1.PodList).Items = l.pods
	return nil
}

// TestFailedJobIsClassifiedByItsPods: a failed Job's failure is its pods', classified as
// the container plugin classifies a pod (flytek8s.ClassifyExit), not the Job's reason,
// which says only that a pod failed: the same ending is the same failure whichever
// plugin ran the task.
func TestFailedJobIsClassifiedByItsPods(t *testing.T) {
	ctx := context.Background()
	uid := types.UID("job-uid")
	at := func(s int) metav1.Time { return metav1.NewTime(time.Date(2026, 12, 1, 12, 0, s, 0, time.UTC)) }
	deleting := at(0)
	// pod is one of the Job's pods whose task container ended with code and reason.
	pod := func(name string, phase corev1.PodPhase, code int32, reason string, finished int) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name,
			OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: "a0-1", UID: uid, Controller: new(bool)}}},
			Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{Name: flytek8s.ContainerName,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, FinishedAt: at(finished)}}}}}}
		*p.OwnerReferences[0].Controller = true
		return p
	}
	preempted := func(p corev1.Pod) corev1.Pod {
		p.DeletionTimestamp = &deleting
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Message: "preempted"}}
		return p
	}
	// stopped is a pod the Job controller deleted once the Job had failed.
	stopped := func(p corev1.Pod) corev1.Pod { p.DeletionTimestamp = &deleting; return p }
	tests := []struct {
		name     string
		pods     []corev1.Pod
		wantCode string
		wantKind core.ErrorKind
		wantIn   string
	}{
		{name: "no pods left: the Job's reason", wantCode: "BackoffLimitExceeded", wantKind: core.ErrorKindUser},
		{name: "a pod's exit code", pods: []corev1.Pod{pod("a0-1-x", corev1.PodFailed, 3, "Error", 1)},
			wantCode: "ExitCode3", wantKind: core.ErrorKindUser, wantIn: "pod a0-1-x: container task exited with 3"},
		{name: "a pod killed by a signal", pods: []corev1.Pod{pod("a0-1-x", corev1.PodFailed, 137, "Error", 1)},
			wantCode: "KilledBySIGKILL", wantKind: core.ErrorKindUser},
		{name: "a pod out of memory", pods: []corev1.Pod{pod("a0-1-x", corev1.PodFailed, 137, "OOMKilled", 1)},
			wantCode: "OOMKilled", wantKind: core.ErrorKindUser},
		{name: "a preempted pod is the platform's", pods: []corev1.Pod{preempted(pod("a0-1-x", corev1.PodFailed, 143, "Error", 1))},
			wantCode: "Preempted", wantKind: core.ErrorKindSystem},
		{name: "the failing pod, not those the Job controller stopped after it",
			pods: []corev1.Pod{stopped(pod("a0-1-a", corev1.PodFailed, 143, "Error", 2)), pod("a0-1-b", corev1.PodFailed, 2, "Error", 1),
				pod("a0-1-c", corev1.PodSucceeded, 0, "Completed", 0)},
			wantCode: "ExitCode2", wantKind: core.ErrorKindUser, wantIn: "pod a0-1-b"},
		{name: "the preemption, not the deletions it caused",
			pods:     []corev1.Pod{stopped(pod("a0-1-a", corev1.PodFailed, 143, "Error", 2)), preempted(pod("a0-1-b", corev1.PodFailed, 143, "Error", 3))},
			wantCode: "Preempted", wantKind: core.ErrorKindSystem, wantIn: "pod a0-1-b"},
		{name: "of two failing pods, the first to end",
			pods:     []corev1.Pod{pod("a0-1-a", corev1.PodFailed, 4, "Error", 5), pod("a0-1-b", corev1.PodFailed, 5, "Error", 4)},
			wantCode: "ExitCode5", wantKind: core.ErrorKindUser},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "mem://out/r1"}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: datastore.New()})
			j := batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "a0-1", UID: uid}, Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{
				Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"}}}}
			info, err := Plugin{reader: podLister{pods: tt.pods}}.GetTaskPhase(ctx, tCtx, &j)
			if err != nil {
				t.Fatal(err)
			}
			if info.Phase != core.PhaseRetryableFailure || info.Err == nil || info.Err.Code != tt.wantCode || info.Err.Kind != tt.wantKind {
				t.Fatalf("got %s with %+v; want %s of kind %d", info.Phase, info.Err, tt.wantCode, tt.wantKind)
			}
			if !strings.Contains(info.Err.Message, tt.wantIn) || info.Message != info.Err.Message {
				t.Fatalf("message %q (the phase's %q); want %q in it", info.Err.Message, info.Message, tt.wantIn)
			}
		})
	}
}
