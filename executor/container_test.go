package executor_test

import (
	"context"
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
	"github.com/flytekube/backend/executor/config"
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
	cfg := testConfig()
	cfg.LogLinks = []config.LogLink{{Name: "Kubernetes", URITemplate: "https://logs.example.com/{{.Namespace}}/{{.PodName}}/{{.ContainerName}}?attempt={{.Attempt}}"}}
	run(t, cfg, ns, &count)
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

	// The scheduler complains about the pod, then the kubelet starts it.
	now := metav1.Now()
	if err := env.Client.Create(context.Background(), &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "c0-1.scheduling", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: pod.Name, Namespace: ns, UID: pod.UID, APIVersion: "v1"},
		Type:           corev1.EventTypeWarning, Reason: "FailedScheduling", Message: "0/1 nodes are available",
		FirstTimestamp: now, LastTimestamp: now, Count: 2, Source: corev1.EventSource{Component: "default-scheduler"},
	}); err != nil {
		t.Fatal(err)
	}
	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	var seen []string
	for _, h := range got.Status.PhaseHistory {
		for _, e := range h.ClusterEvents {
			seen = append(seen, e.Object+" "+e.Reason)
		}
	}
	if !slices.Contains(seen, "Pod/c0-1 FailedScheduling") {
		t.Fatalf("cluster events in the history %v; want the scheduler's", seen)
	}
	want := "https://logs.example.com/" + ns + "/c0-1/task?attempt=1"
	running := 0
	for _, h := range got.Status.PhaseHistory {
		if h.Phase != flytev1.PhaseRunning {
			continue
		}
		running++
		if len(h.LogLinks) != 1 || h.LogLinks[0].URI != want || h.LogLinks[0].Name != "Kubernetes" {
			t.Fatalf("the Running entry's log links %+v; want %s", h.LogLinks, want)
		}
	}
	if running == 0 {
		t.Fatalf("no Running entry in %+v", got.Status.PhaseHistory)
	}
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

// TestGracefulDeletionIsNotAFailure is the upstream bug: a running pod deleted gracefully
// (preemption, a drained node) must keep its action Running, start nothing beside it, and
// only once it is gone start a new attempt under a new name, on the system budget.
func TestGracefulDeletionIsNotAFailure(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := containerAction(ns, "c2", 0) // no user retries: only the system budget may relaunch it
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "c2-1")
	// Bound to a node, a pod is deleted gracefully: it stays, with a deletionTimestamp.
	if err := env.Client.SubResource("binding").Create(context.Background(), pod,
		&corev1.Binding{Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}); err != nil {
		t.Fatalf("binding: %v", err)
	}
	pod = waitPod(t, ns, "c2-1")
	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)

	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: "PreemptionByScheduler", Message: "preempted by a higher-priority pod"})
	if err := env.Client.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	// During the grace period: Running, reason Preempted, and no second pod.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got flytev1.TaskAction
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase.IsTerminal() || got.Status.Attempts != 1 {
			t.Fatalf("during the grace period the action moved on: %s, attempt %d", got.Status.Phase, got.Status.Attempts)
		}
		if c := findProgressing(&got); c != nil && c.Reason == "Preempted" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the action never said Preempted: %+v", got.Status.Conditions)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	var pods corev1.PodList
	if err := env.Client.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods during the grace period; want only the terminating one", len(pods.Items))
	}

	var mid flytev1.TaskAction
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &mid); err != nil {
		t.Fatal(err)
	}
	last := mid.Status.PhaseHistory[len(mid.Status.PhaseHistory)-1]
	if last.Phase != flytev1.PhaseRunning || last.Reason != "Preempted" || last.Version == 0 {
		t.Fatalf("history ends %+v; want the preemption recorded as a new version of Running", last)
	}

	// The kubelet finishes the deletion: now, and only now, a new attempt starts.
	if err := env.Client.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	second := waitPod(t, ns, "c2-2")
	kubelet(t, second, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	if got.Status.Attempts != 2 || got.Status.SystemFailures != 1 {
		t.Fatalf("attempts %d, system failures %d; want 2 and 1", got.Status.Attempts, got.Status.SystemFailures)
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

// TestQuotaRejectionWaitsWithoutSpendingAnAttempt: a ResourceQuota that refuses the pod
// holds the action in WaitingForResources; once there is room, the same attempt runs.
func TestQuotaRejectionWaitsWithoutSpendingAnAttempt(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	// No quota controller runs here, so the test fills in the quota's status itself.
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}}}
	if err := env.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	quota.Status = corev1.ResourceQuotaStatus{
		Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")},
		Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}, // full
	}
	if err := env.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := containerAction(ns, "c3", 0)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseWaitingForResources)
	var waiting flytev1.TaskAction
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ta), &waiting); err != nil {
		t.Fatal(err)
	}
	if c := findProgressing(&waiting); c == nil || c.Reason != "ResourceQuotaExceeded" || waiting.Status.Attempts != 1 {
		t.Fatalf("waiting: %+v, attempts %d", c, waiting.Status.Attempts)
	}

	quota.Status.Used = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")} // room now
	if err := env.Client.Status().Update(ctx, quota); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "c3-1") // the same attempt, once the quota allows it
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	if got := waitSucceeded(t, client.ObjectKeyFromObject(ta)); got.Status.Attempts != 1 || got.Status.SystemFailures != 0 {
		t.Fatalf("attempts %d, system failures %d; want a single attempt and no failure", got.Status.Attempts, got.Status.SystemFailures)
	}
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
			plugin.LabelManagedBy: plugin.ManagedByValue, plugin.LabelAttempt: "1", k8s.LabelTaskActionUID: "an-older-action"}},
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

// TestRestartWithAPodInFlightCreatesNoSecondPod: a new executor finds the attempt's pod
// and carries on with it.
func TestRestartWithAPodInFlightCreatesNoSecondPod(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	var first, second atomic.Int64
	stopFirst := run(t, testConfig(), ns, &first)
	ta := containerAction(ns, "c6", 2)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "c6-1")
	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	stopFirst()

	run(t, testConfig(), ns, &second)
	pod = waitPod(t, ns, "c6-1")
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || got.Status.Attempts != 1 || second.Load() == 0 {
		t.Fatalf("%d pods, %d attempts, %d reconciles by the new executor; want 1 pod, 1 attempt, the new executor finishing it",
			len(pods.Items), got.Status.Attempts, second.Load())
	}
}

// TestClusterDefaultsAreApplied: the k8s section of the configuration reaches every pod
// (labels, annotations, requests, interruptible placement, the object finalizer), and at
// the end of the attempt the finalizer comes off and, when so configured, the pod goes.
func TestClusterDefaultsAreApplied(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.K8s = config.K8sPluginConfig{
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
	case pod.Labels["team"] != "ml" || pod.Labels[plugin.LabelManagedBy] != plugin.ManagedByValue:
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

// TestPodStoppedByItsDeletionIsRelaunched: a kubelet that stops a pod for a graceful
// deletion marks it Failed (the container exits on SIGTERM, 143) before the pod goes. The
// deletion ended it, not the task: a new attempt on the system budget, not a user retry.
func TestPodStoppedByItsDeletionIsRelaunched(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := containerAction(ns, "k0", 0) // no user retries: a user failure would end it
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := bindAndRun(t, ta, "k0-1")
	if err := env.Client.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod = waitPod(t, ns, "k0-1")
	kubelet(t, pod, corev1.PodFailed, &corev1.ContainerStateTerminated{ExitCode: 143, Reason: "Error"})

	second := waitPod(t, ns, "k0-2")
	kubelet(t, second, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	if got.Status.Attempts != 2 || got.Status.SystemFailures != 1 {
		t.Fatalf("attempts %d, system failures %d; want 2 and 1", got.Status.Attempts, got.Status.SystemFailures)
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
	podName := plugin.AttemptObjectName(name, 1)
	pod := waitPod(t, ns, podName)
	if got := pod.Labels[plugin.LabelTaskAction]; len(got) > 63 || got == "" {
		t.Fatalf("pod label %s=%q", plugin.LabelTaskAction, got)
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
