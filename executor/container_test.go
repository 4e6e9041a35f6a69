package executor_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/plugin"
	"github.com/flytekube/backend/executor/plugin/k8s"
	"github.com/flytekube/backend/executor/plugins/container"
)

func containerAction(ns, name string, retries int32) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: name,
			TaskName: "demo.container", TaskType: "container", RunOutputBase: "mem://out/r1", Retries: retries,
			InputURI:  "mem://in/r1/inputs.json",
			Container: &flytev1.ContainerSpec{Image: "busybox:1.36", Command: []string{"sh", "-c", "exit 0"}}},
	}
}

// waitPod waits for an attempt's pod to exist.
func waitPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var pod corev1.Pod
	for time.Now().Before(deadline) {
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pod); err == nil {
			return &pod
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("pod %s/%s was never created", ns, name)
	return nil
}

// kubelet sets a pod's status, as the node running it would.
func kubelet(t *testing.T, pod *corev1.Pod, phase corev1.PodPhase, terminated *corev1.ContainerStateTerminated) {
	t.Helper()
	pod.Status.Phase = phase
	state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	if terminated != nil {
		state = corev1.ContainerState{Terminated: terminated}
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container.ContainerName, Image: "busybox:1.36", State: state}}
	if err := env.Client.Status().Update(context.Background(), pod); err != nil {
		t.Fatalf("kubelet: %v", err)
	}
}

func TestContainerTaskRunsAsAPod(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := containerAction(ns, "c0", 0)
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "c0-1")

	if pod.Labels[plugin.LabelManagedBy] != plugin.ManagedByValue || pod.Labels[plugin.LabelAttempt] != "1" || pod.Labels[k8s.LabelTaskActionUID] == "" {
		t.Fatalf("labels %v", pod.Labels)
	}
	if ref := metav1.GetControllerOf(pod); ref == nil || ref.Kind != "TaskAction" || ref.Name != "c0" {
		t.Fatalf("controller reference %+v", ref)
	}
	c := pod.Spec.Containers[0]
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || c.Image != "busybox:1.36" ||
		!c.Resources.Requests.Cpu().Equal(resource.MustParse("100m")) || !c.Resources.Requests.Memory().Equal(resource.MustParse("128Mi")) {
		t.Fatalf("pod spec %+v", pod.Spec)
	}
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name+"="+e.Value)
	}
	for _, want := range []string{"FLYTE_INPUT_URI=mem://in/r1/inputs.json", "FLYTE_OUTPUT_PREFIX=mem://out/r1/c0/1", "FLYTE_ATTEMPT=1"} {
		if !slices.Contains(names, want) {
			t.Fatalf("env %v lacks %s", names, want)
		}
	}

	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	waitSucceeded(t, client.ObjectKeyFromObject(ta))
}

func TestContainerUserFailureRetriesUnderANewName(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := containerAction(ns, "c1", 1)
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	first := waitPod(t, ns, "c1-1")
	kubelet(t, first, corev1.PodFailed, &corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error"})

	second := waitPod(t, ns, "c1-2") // a new attempt gets a new object name
	kubelet(t, second, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	if got.Status.Attempts != 2 {
		t.Fatalf("attempts %d; want 2", got.Status.Attempts)
	}
	var retried *flytev1.PhaseTransition
	for i := range got.Status.PhaseHistory {
		if got.Status.PhaseHistory[i].Reason == flytev1.ReasonRetrying {
			retried = &got.Status.PhaseHistory[i]
		}
	}
	if retried == nil || retried.Error == nil || retried.Error.Code != "ExitCode3" || retried.Error.Kind != flytev1.ErrorKindUser {
		t.Fatalf("history %+v; want a retry caused by ExitCode3", got.Status.PhaseHistory)
	}
}
