package executor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/plugins/k8s/container"
	"github.com/flytekube/backend/test/eventually"
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
	var pod corev1.Pod
	eventually.True(t, 30*time.Second, func() bool {
		return env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pod) == nil
	}, func() string { return fmt.Sprintf("pod %s/%s was never created", ns, name) })
	return &pod
}

// kubelet sets a pod's status, as the node running it would.
func kubelet(t *testing.T, pod *corev1.Pod, phase corev1.PodPhase, terminated *corev1.ContainerStateTerminated) {
	t.Helper()
	pod.Status.Phase = phase
	state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	if terminated != nil {
		state = corev1.ContainerState{Terminated: terminated}
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: flytek8s.ContainerName, Image: "busybox:1.36", State: state}}
	if err := env.Client.Status().Update(context.Background(), pod); err != nil {
		t.Fatalf("kubelet: %v", err)
	}
}

func findProgressing(ta *flytev1.TaskAction) *metav1.Condition {
	for i := range ta.Status.Conditions {
		if ta.Status.Conditions[i].Type == flytev1.ConditionProgressing {
			return &ta.Status.Conditions[i]
		}
	}
	return nil
}

// TestRequestAboveTheQuotaFailsAtOnce: no amount of waiting fits a pod that asks for more
// than the namespace's quota allows at all.
func TestRequestAboveTheQuotaFailsAtOnce(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	hard := corev1.ResourceList{corev1.ResourceRequestsCPU: resource.MustParse("1")}
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "compute", Namespace: ns}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}
	if err := env.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	quota.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: corev1.ResourceList{corev1.ResourceRequestsCPU: resource.MustParse("0")}}
	if err := env.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := containerAction(ns, "c4", 2)
	ta.Spec.Container.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseFailed)
	var got flytev1.TaskAction
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ta), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Error == nil || got.Status.Error.Code != "ExceedsResourceQuota" || got.Status.Attempts != 1 {
		t.Fatalf("status %+v; want one attempt failed with ExceedsResourceQuota", got.Status)
	}
}

// TestAnotherObjectWithTheAttemptsNameIsNeverAdopted: a pod left by an earlier action of
// the same name is not this attempt's; the action waits for it to go, visibly, instead
// of reporting it as its own.
func TestAnotherObjectWithTheAttemptsNameIsNeverAdopted(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	stale := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "c5-1", Namespace: ns, Labels: map[string]string{
			core.LabelManagedBy: core.ManagedByValue, core.LabelAttempt: "1", k8s.LabelTaskActionUID: "an-older-action"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "task", Image: "busybox:1.36"}}},
	}
	if err := env.Client.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := containerAction(ns, "c5", 0)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	// The executor finds the stale pod under attempt 1's name, refuses it, and goes on
	// as attempt 2 under a new name.
	second := waitPod(t, ns, "c5-2")
	kubelet(t, second, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	if got.Status.Attempts != 2 || got.Status.SystemFailures != 1 {
		t.Fatalf("attempts %d, system failures %d; want 2 and 1", got.Status.Attempts, got.Status.SystemFailures)
	}
	var still corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(stale), &still); err != nil || still.Labels[k8s.LabelTaskActionUID] != "an-older-action" {
		t.Fatalf("the stale pod was touched: %v", err)
	}
}

// TestClusterDefaultsAreApplied: the k8s section of the configuration reaches every pod
// (labels, annotations, requests, interruptible placement, the object finalizer), and at
// the end of the attempt the finalizer comes off and, when so configured, the pod goes.
func TestClusterDefaultsAreApplied(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.K8s = k8s.Config{
		DefaultCPURequest: resource.MustParse("250m"), DefaultMemoryRequest: resource.MustParse("64Mi"),
		DefaultLabels: map[string]string{"team": "ml"}, DefaultAnnotations: map[string]string{"example.com/owner": "platform"},
		InterruptibleTolerations:  []corev1.Toleration{{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		InterruptibleNodeSelector: map[string]string{"node.example.com/spot": "true"},
		InjectFinalizer:           true, DeleteOnFinalize: true,
	}
	var count atomic.Int64
	run(t, cfg, ns, &count)
	ta := containerAction(ns, "d0", 0)
	ta.Spec.Interruptible = true
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "d0-1")
	c := pod.Spec.Containers[0]
	switch {
	case pod.Labels["team"] != "ml" || pod.Labels[core.LabelManagedBy] != core.ManagedByValue:
		t.Fatalf("labels %v", pod.Labels)
	case pod.Annotations["example.com/owner"] != "platform":
		t.Fatalf("annotations %v", pod.Annotations)
	case !c.Resources.Requests.Cpu().Equal(resource.MustParse("250m")) || !c.Resources.Requests.Memory().Equal(resource.MustParse("64Mi")):
		t.Fatalf("requests %v", c.Resources.Requests)
	case len(pod.Spec.Tolerations) == 0 || !slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool { return t.Key == "spot" }):
		t.Fatalf("tolerations %v", pod.Spec.Tolerations)
	case pod.Spec.NodeSelector["node.example.com/spot"] != "true":
		t.Fatalf("node selector %v", pod.Spec.NodeSelector)
	case !slices.Contains(pod.Finalizers, k8s.Finalizer):
		t.Fatalf("finalizers %v", pod.Finalizers)
	}

	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	waitSucceeded(t, client.ObjectKeyFromObject(ta))
	waitGone(t, pod) // finalizer removed, then deleted
}

// TestActionAppliedAsYAMLStarts: an action written by hand keeps the spelling its author
// chose (cpu "0.5", timeout "90s", no resources at all). Nothing the executor writes may
// send the spec back in its own spelling: the CRD holds the spec immutable, so such a
// write would be refused, forever.
func TestActionAppliedAsYAMLStarts(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	for name, container := range map[string]string{
		"y0": `{image: "busybox:1.36", command: [sh, -c, "exit 0"], resources: {requests: {cpu: "0.5", memory: 100M}}}`,
		"y1": `{image: "busybox:1.36"}`,
	} {
		manifest := `
apiVersion: flyte.org/v1
kind: TaskAction
metadata: {name: ` + name + `, namespace: ` + ns + `}
spec:
  project: demo
  domain: development
  runName: r1
  actionName: ` + name + `
  taskName: demo.container
  taskType: container
  runOutputBase: mem://out/r1
  timeout: 90s
  container: ` + container + `
`
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, &obj); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		pod := waitPod(t, ns, name+"-1")
		kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
		waitSucceeded(t, client.ObjectKey{Namespace: ns, Name: name})
	}
}

// A TaskAction's name may be any DNS subdomain, up to 253 characters; its pod's name and
// labels must still be valid (a label value holds at most 63 characters), and the pod's
// changes must still wake the action.
func TestActionWithALongNameRuns(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	name := "r1-" + strings.Repeat("a", 60) + ".train-" + strings.Repeat("b", 40)
	ta := containerAction(ns, name, 0)
	ta.Spec.ActionName = "train"
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	podName := core.AttemptObjectName(name, 1)
	pod := waitPod(t, ns, podName)
	if got := pod.Labels[core.LabelTaskAction]; len(got) > 63 || got == "" {
		t.Fatalf("pod label %s=%q", core.LabelTaskAction, got)
	}
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	waitSucceeded(t, client.ObjectKeyFromObject(ta))
}

// unownedContainer is the container plugin for objects the TaskAction may not own.
type unownedContainer struct{ container.Plugin }

func (unownedContainer) GetProperties() k8s.Properties {
	return k8s.Properties{DisableInjectOwnerReferences: true}
}

// Objects created without an owner reference still wake their action when they change:
// the watch finds the action by the object's labels. The test gives the executor no
// periodic resync to fall back on, so without the wake-up the action never finishes.
func TestObjectsWithoutOwnerWakeTheirAction(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	cfg := testConfig()
	runWith(t, cfg, ns, &count, k8s.Entry(k8s.PluginEntry{
		ID: "unowned-container", RegisteredTaskTypes: []string{"unowned-container"},
		ResourceToWatch: &corev1.Pod{}, Plugin: unownedContainer{},
	}, k8s.Config{}))
	ta := containerAction(ns, "u0", 0)
	ta.Spec.TaskType = "unowned-container"
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "u0-1")
	if len(pod.OwnerReferences) != 0 {
		t.Fatalf("owner references %+v", pod.OwnerReferences)
	}
	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	waitSucceeded(t, client.ObjectKeyFromObject(ta))

	// Nothing else would delete a pod without an owner: the finished attempt takes it.
	waitGone(t, pod)
}

// TestLimitBelowTheDefaultRequest: a container that sets a limit and no request gets the
// limit as its request, as Kubernetes defaults it, not the cluster's default request,
// which may lie above the limit and make the pod invalid.
func TestLimitBelowTheDefaultRequest(t *testing.T) {
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.K8s.DefaultMemoryRequest = resource.MustParse("128Mi")
	var count atomic.Int64
	run(t, cfg, ns, &count)
	ta := containerAction(ns, "small", 0)
	ta.Spec.Container.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "small-1")
	if got := pod.Spec.Containers[0].Resources.Requests.Memory(); !got.Equal(resource.MustParse("64Mi")) {
		t.Fatalf("memory request %s; want the limit, 64Mi", got)
	}
}
