// Package realnode_test runs container actions on a real node (test/nodetest): pods
// scheduled by the real scheduler and run by kubelet and containerd. Everything else
// is tested on envtest, which is faster; these tests show what a stand-in kubelet cannot.
package realnode_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/nodetest"
	"github.com/flytekube/backend/test/repo"
)

var node *nodetest.Node

func TestMain(m *testing.M) {
	crds, err := repo.Path("deploy", "crd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scheme, err := executor.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(nodetest.Main(m, &node, nodetest.Options{CRDDirectoryPaths: []string{crds}, Scheme: scheme}))
}

// runExecutor runs an executor restricted to ns until the test ends.
func runExecutor(t *testing.T, ns string, configure ...func(*config.Config)) {
	t.Helper()
	startExecutor(t, ns, configure...)
}

// startExecutor starts an executor restricted to ns and returns how to stop it (it also
// stops when the test ends).
func startExecutor(t *testing.T, ns string, configure ...func(*config.Config)) (stop func()) {
	t.Helper()
	cfg := config.Default()
	for _, c := range configure {
		c(&cfg)
	}
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL, cfg.CacheServiceURL = "", "" // events and cache are tested on envtest
	cfg.GC.Interval = metav1.Duration{}
	cfg.LeaderElect = false
	cfg.RetryBackoff.Base, cfg.RetryBackoff.Cap = metav1.Duration{Duration: 200 * time.Millisecond}, metav1.Duration{Duration: time.Second}
	cfg.Namespaces = []string{ns}
	_, stop = kubetest.RunManager(t, func(ctx context.Context) (manager.Manager, error) {
		return executor.Setup(ctx, cfg, node.Config, slog.New(slog.DiscardHandler),
			executor.Options{SkipNameValidation: true, MetricsRegistry: prometheus.NewRegistry()})
	})
	return stop
}

func containerAction(ns, name string, retries int32, command string) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "real", ActionName: name,
			TaskName: "demo.container", TaskType: "container", RunOutputBase: "mem://out/real", Retries: retries,
			Container: &flytev1.ContainerSpec{Image: node.Images[0], Command: []string{"sh", "-c", command},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}}},
	}
}

// waitFor waits until the action meets cond (what names it) and returns it.
func waitFor(t *testing.T, ta *flytev1.TaskAction, what string, cond func(*flytev1.TaskAction) bool) *flytev1.TaskAction {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var got flytev1.TaskAction
	for {
		if err := node.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err == nil && cond(&got) {
			return &got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never %s; status %+v", ta.Name, what, got.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFinished waits until the action is finished and returns it.
func waitFinished(t *testing.T, ta *flytev1.TaskAction) *flytev1.TaskAction {
	t.Helper()
	return waitFor(t, ta, "finished", func(a *flytev1.TaskAction) bool { return a.Status.Phase.IsTerminal() })
}

// waitPhase waits until the action is in phase.
func waitPhase(t *testing.T, ta *flytev1.TaskAction, phase flytev1.Phase) *flytev1.TaskAction {
	t.Helper()
	return waitFor(t, ta, "became "+string(phase), func(a *flytev1.TaskAction) bool { return a.Status.Phase == phase })
}

// create creates the action.
func create(t *testing.T, ta *flytev1.TaskAction) {
	t.Helper()
	if err := node.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
}

func history(ta *flytev1.TaskAction) string {
	var parts []string
	for _, h := range ta.Status.PhaseHistory {
		parts = append(parts, fmt.Sprintf("%s/%s@%d", h.Phase, h.Reason, h.Attempt))
	}
	return strings.Join(parts, " ")
}

// TestContainerTaskRunsAsARealPod: the task reads its inputs and writes its outputs
// where the executor reads them (file:// storage mounted into the pod), its log is on
// the node, and a task that writes an error document fails with the document's code.
func TestContainerTaskRunsAsARealPod(t *testing.T) {
	ns := node.Namespace(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "inputs.json"), []byte(`{"name": "node"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	runExecutor(t, ns, func(c *config.Config) {
		c.Storage.AllowedPrefixes, c.K8s.MountFileStorage = []string{"file://" + dir}, true
		c.LogLinks = []config.LogLink{{Name: "Kubernetes", URITemplate: "https://logs.example.com/{{.Namespace}}/{{.PodName}}/{{.ContainerName}}?attempt={{.Attempt}}"}}
	})
	onDisk := func(ta *flytev1.TaskAction) *flytev1.TaskAction {
		ta.Spec.InputURI, ta.Spec.RunOutputBase = "file://"+dir+"/inputs.json", "file://"+dir+"/real"
		return ta
	}
	// It runs for a few seconds: the kubelet posts its events asynchronously, and the
	// executor reports those that exist at each change of phase. The kubelet's Started
	// often falls in the same second as the scheduler's Scheduled, with a coarser time,
	// which is what this test caught.
	ta := onDisk(containerAction(ns, "hello", 0, `echo hello from $HOSTNAME; out=${FLYTE_OUTPUT_PREFIX#file://}; `+
		`sed 's/"name"/"greeting"/' ${FLYTE_INPUT_URI#file://} > $out/outputs.json; sleep 3`))
	failing := onDisk(containerAction(ns, "refuses", 0, `echo '{"code": "BadName", "message": "no such name"}' > ${FLYTE_OUTPUT_PREFIX#file://}/error.json`))
	create(t, ta)
	create(t, failing)
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 1 {
		t.Fatalf("ended %s after %d attempts (%s); want Succeeded after 1", got.Status.Phase, got.Status.Attempts, history(got))
	}
	if want := "file://" + dir + "/real/hello/1/outputs.json"; got.Status.OutputsURI != want {
		t.Fatalf("outputs at %q; want %q", got.Status.OutputsURI, want)
	}
	if out, err := os.ReadFile(filepath.Join(dir, "real/hello/1/outputs.json")); err != nil || strings.TrimSpace(string(out)) != `{"greeting": "node"}` {
		t.Fatalf("outputs %q (%v)", out, err)
	}
	var pod corev1.Pod
	if err := node.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "hello-1"}, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod on node %q in phase %s", pod.Spec.NodeName, pod.Status.Phase)
	}
	logs, err := node.Logs(context.Background(), &pod, pod.Spec.Containers[0].Name)
	if err != nil || !strings.Contains(logs, "hello from hello-1") {
		t.Fatalf("logs %q (%v)", logs, err)
	}
	if pod.Labels[core.LabelManagedBy] != core.ManagedByValue || pod.Labels[core.LabelAttempt] != "1" || pod.Labels[k8s.LabelTaskActionUID] != string(got.UID) {
		t.Fatalf("labels %v", pod.Labels)
	}
	if ref := metav1.GetControllerOf(&pod); ref == nil || ref.Kind != "TaskAction" || ref.UID != got.UID {
		t.Fatalf("controller reference %+v", ref)
	}
	// The history carries the links to the attempt's logs and what the scheduler and
	// the kubelet said about its pod, each named as the event's source.
	links, events := map[string]bool{}, map[string]bool{}
	for _, h := range got.Status.PhaseHistory {
		for _, l := range h.LogLinks {
			links[l.Name+" "+l.URI] = true
		}
		for _, e := range h.ClusterEvents {
			events[e.Object+" "+e.Reason+" "+e.Source] = true
		}
	}
	if want := "Kubernetes https://logs.example.com/" + ns + "/hello-1/task?attempt=1"; !links[want] {
		t.Fatalf("log links %v; want %s", links, want)
	}
	if !events["Pod/hello-1 Scheduled default-scheduler"] || !events["Pod/hello-1 Started kubelet"] {
		t.Fatalf("cluster events in the history %v; want the scheduler's Scheduled and the kubelet's Started", events)
	}
	if f := waitFinished(t, failing); f.Status.Phase != flytev1.PhaseFailed || f.Status.Error == nil || f.Status.Error.Code != "BadName" {
		t.Fatalf("the task that wrote an error document ended %s with %+v (%s)", f.Status.Phase, f.Status.Error, history(f))
	}
}

func TestFailingContainerRetriesInANewPod(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns)
	ta := containerAction(ns, "fails", 1, "echo failing; exit 3")
	create(t, ta)
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Attempts != 2 || got.Status.UserFailures != 2 {
		t.Fatalf("ended %s after %d attempts, %d user failures (%s); want Failed after 2 and 2", got.Status.Phase,
			got.Status.Attempts, got.Status.UserFailures, history(got))
	}
	if e := got.Status.Error; e == nil || e.Kind != flytev1.ErrorKindUser || e.Code != "ExitCode3" || !strings.Contains(e.Message, "exited with 3") {
		t.Fatalf("error %+v; want the user's exit code 3", e)
	}
	retried := false
	for _, h := range got.Status.PhaseHistory {
		retried = retried || h.Reason == flytev1.ReasonAttemptFailed && h.Error != nil && h.Error.Code == "ExitCode3"
	}
	if !retried {
		t.Fatalf("history %s; want a retry caused by ExitCode3", history(got))
	}
	for _, name := range []string{"fails-1", "fails-2"} {
		var pod corev1.Pod
		if err := node.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
			t.Fatalf("attempt pod %s: %v", name, err)
		}
	}
}

func TestOOMKilledContainerIsReported(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns)
	// A shell variable of 128 MiB under a 64 MiB limit.
	ta := containerAction(ns, "hungry", 0, `x=$(head -c 134217728 /dev/zero | tr '\0' a); echo ${#x}`)
	create(t, ta)
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseFailed {
		t.Fatalf("ended %s (%s); want Failed", got.Status.Phase, history(got))
	}
	if e := got.Status.Error; e == nil || !strings.Contains(e.Message, "OOMKilled") {
		t.Fatalf("error %+v; want OOMKilled named", e)
	}
}

// A task killed by a signal, with nothing stopping its pod, is the user's failure named
// by the signal, the same whether a pod or a Job's pod ran it. The shell that is the
// container's first process cannot be killed from inside the container, so it runs one
// that kills itself and exits with its status, 128+N, as a wrapper script would. The
// kubelet reads "$$" in a container's command as an escaped "$", so "$$$$" reaches the
// shell as its own PID, "$$".
func TestContainerKilledByASignalIsNamedByIt(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns)
	tests := []struct{ name, taskType, signal, wantCode string }{
		{name: "killed", taskType: "container", signal: "KILL", wantCode: "KilledBySIGKILL"},
		{name: "terminated", taskType: "k8s-job", signal: "TERM", wantCode: "KilledBySIGTERM"},
	}
	var actions []*flytev1.TaskAction
	for _, tt := range tests {
		ta := containerAction(ns, tt.name, 0, `sh -c 'kill -`+tt.signal+` $$$$'; exit $?`)
		ta.Spec.TaskType = tt.taskType
		create(t, ta)
		actions = append(actions, ta)
	}
	for i, tt := range tests {
		got := waitFinished(t, actions[i])
		if got.Status.Phase != flytev1.PhaseFailed || got.Status.SystemFailures != 0 {
			t.Fatalf("%s ended %s with %d system failures (%s); want Failed with none", tt.name, got.Status.Phase, got.Status.SystemFailures, history(got))
		}
		if e := got.Status.Error; e == nil || e.Kind != flytev1.ErrorKindUser || e.Code != tt.wantCode || !strings.Contains(e.Message, "SIG"+tt.signal) {
			t.Fatalf("%s (%s): error %+v; want the user's %s naming SIG%s", tt.name, tt.taskType, e, tt.wantCode, tt.signal)
		}
	}
}

// An image the node does not have and cannot pull fails the action as the user's error
// once the pull grace period is over, rather than waiting for ever.
func TestMissingImageIsAUserError(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns, func(c *config.Config) { c.K8s.ImagePullGracePeriod = metav1.Duration{Duration: 3 * time.Second} })
	ta := containerAction(ns, "missing", 2, "true")
	ta.Spec.Container.Image = "flyte.local/not-there:1"
	create(t, ta)
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Attempts != 1 {
		t.Fatalf("ended %s after %d attempts (%s); want Failed after 1: retrying cannot bring the image", got.Status.Phase, got.Status.Attempts, history(got))
	}
	if e := got.Status.Error; e == nil || e.Code != "ImagePullFailed" || e.Kind != flytev1.ErrorKindUser {
		t.Fatalf("error %+v; want the user's ImagePullFailed", e)
	}
}

// podsOf lists the pods of an action's attempts that exist now.
func podsOf(t *testing.T, ns string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := node.Client.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// Seed 004 on a real node: a running action's pod deleted gracefully, whose container
// ignores SIGTERM, stays Terminating for its grace period. Meanwhile no second pod is
// made (the quota, which still counts the terminating pod, would refuse it anyway), the
// action keeps its attempt budget, and the relaunch comes once the pod is gone.
func TestGracefulPodDeletionIsRelaunchedOnlyOnceThePodIsGone(t *testing.T) {
	ctx := context.Background()
	ns := node.Namespace(t)
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}}}
	if err := node.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	runExecutor(t, ns)
	// The first attempt ignores TERM and sleeps; the second succeeds at once.
	ta := containerAction(ns, "graceful", 0, `case $HOSTNAME in *-1) trap "" TERM; echo started; sleep 120;; *) echo second;; esac`)
	create(t, ta)
	waitPhase(t, ta, flytev1.PhaseRunning)
	var pod corev1.Pod
	if err := node.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "graceful-1"}, &pod); err != nil {
		t.Fatal(err)
	}
	const grace = 10
	deleted := time.Now()
	if err := node.Client.Delete(ctx, &pod, client.GracePeriodSeconds(grace)); err != nil {
		t.Fatal(err)
	}
	// While the pod terminates: one pod, the first; the quota counts it; attempt 1.
	for time.Since(deleted) < (grace-2)*time.Second {
		pods := podsOf(t, ns)
		if len(pods) != 1 || pods[0].Name != "graceful-1" {
			t.Fatalf("%s after the deletion: pods %v; want graceful-1 alone, terminating", time.Since(deleted).Round(time.Millisecond), names(pods))
		}
		var got flytev1.TaskAction
		if err := node.Client.Get(ctx, client.ObjectKeyFromObject(ta), &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Attempts != 1 || got.Status.Phase.IsTerminal() {
			t.Fatalf("while the pod terminates the action is %s on attempt %d (%s)", got.Status.Phase, got.Status.Attempts, history(&got))
		}
		time.Sleep(500 * time.Millisecond)
	}
	var used corev1.ResourceQuota
	if err := node.Client.Get(ctx, client.ObjectKeyFromObject(quota), &used); err != nil {
		t.Fatal(err)
	}
	if n := used.Status.Used[corev1.ResourcePods]; n.Value() != 1 {
		t.Fatalf("quota used %s pods while one terminates", n.String())
	}
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 2 || got.Status.UserFailures != 0 {
		t.Fatalf("ended %s after %d attempts, %d user failures (%s); want Succeeded on attempt 2 with none",
			got.Status.Phase, got.Status.Attempts, got.Status.UserFailures, history(got))
	}
	if took := time.Since(deleted); took < grace*time.Second {
		t.Fatalf("the relaunch finished %s after the deletion, before the %ds grace period was over", took, grace)
	}
}

// A running action's pod preempted by the real scheduler for a pod of higher priority:
// the scheduler marks it a disruption target and deletes it, its container exits on
// SIGTERM, and the kubelet marks it Failed. The action stays Running (reason Preempted),
// and its next attempt, on the system budget, starts once the pod is gone and runs
// once the preemptor has finished.
func TestPreemptedPodIsRelaunchedOnTheSystemBudget(t *testing.T) {
	ctx := context.Background()
	ns := node.Namespace(t)
	high := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-high"}, Value: 1000000}
	if err := node.Client.Create(ctx, high); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Client.Delete(context.Background(), high) })
	// Each pod asks for most of the node's CPU, so the two cannot run together.
	var nodes corev1.NodeList
	if err := node.Client.List(ctx, &nodes); err != nil || len(nodes.Items) != 1 {
		t.Fatalf("nodes %d (%v)", len(nodes.Items), err)
	}
	cpu := resource.NewMilliQuantity(nodes.Items[0].Status.Allocatable.Cpu().MilliValue()*3/4, resource.DecimalSI)
	runExecutor(t, ns)
	ta := containerAction(ns, "preempted", 0, `case $HOSTNAME in *-1) trap "echo got TERM; exit 143" TERM; while true; do sleep 1; done;; *) echo second;; esac`)
	ta.Spec.Container.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *cpu}
	create(t, ta)
	waitPhase(t, ta, flytev1.PhaseRunning)

	preemptor := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "preemptor", Namespace: ns}, Spec: corev1.PodSpec{
		PriorityClassName: high.Name, RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "c", Image: node.Images[0], Command: []string{"sleep", "3"},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: *cpu}}}}}}
	if err := node.Client.Create(ctx, preemptor); err != nil {
		t.Fatal(err)
	}
	// While the first pod's container may still run, no second attempt's pod may exist.
	stopWatching := make(chan struct{})
	overlap := make(chan string, 1)
	go func() {
		for {
			select {
			case <-stopWatching:
				close(overlap)
				return
			case <-time.After(100 * time.Millisecond):
			}
			pods := podsOf(t, ns)
			phases := map[string]corev1.PodPhase{}
			for _, p := range pods {
				phases[p.Name] = p.Status.Phase
			}
			first, running := phases["preempted-1"]
			if _, second := phases["preempted-2"]; second && running && first != corev1.PodFailed && first != corev1.PodSucceeded {
				overlap <- fmt.Sprintf("%v", phases)
				close(overlap)
				return
			}
		}
	}()
	got := waitFinished(t, ta)
	close(stopWatching)
	if pods, ok := <-overlap; ok {
		t.Fatalf("a second attempt's pod existed while the preempted one's container could still run: %s", pods)
	}
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 2 || got.Status.SystemFailures != 1 || got.Status.UserFailures != 0 {
		t.Fatalf("ended %s after %d attempts, %d system and %d user failures (%s); want Succeeded on attempt 2 after 1 system failure",
			got.Status.Phase, got.Status.Attempts, got.Status.SystemFailures, got.Status.UserFailures, history(got))
	}
	preempted := false
	for _, h := range got.Status.PhaseHistory {
		preempted = preempted || h.Attempt == 1 && h.Reason == "Preempted"
	}
	if !preempted {
		t.Fatalf("history %s; want attempt 1 Preempted", history(got))
	}
}

func names(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// A namespace whose quota holds one pod runs two actions one after the other: the
// second waits as WaitingForResources, spending no attempt, until the first is done.
func TestQuotaQueuesRealPods(t *testing.T) {
	ctx := context.Background()
	ns := node.Namespace(t)
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}}}
	if err := node.Client.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	runExecutor(t, ns, func(c *config.Config) { c.K8s.DeleteOnFinalize = true }) // a finished pod frees the quota
	first := containerAction(ns, "first", 0, "sleep 3")
	second := containerAction(ns, "second", 0, "true")
	create(t, first)
	waitPhase(t, first, flytev1.PhaseRunning)
	create(t, second)
	waitFor(t, second, "waited on the quota", func(a *flytev1.TaskAction) bool {
		c := meta.FindStatusCondition(a.Status.Conditions, flytev1.ConditionProgressing)
		return a.Status.Phase == flytev1.PhaseWaitingForResources && c != nil && c.Reason == "ResourceQuotaExceeded" && a.Status.Attempts == 1
	})
	for _, ta := range []*flytev1.TaskAction{first, second} {
		got := waitFinished(t, ta)
		if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 1 {
			t.Fatalf("%s ended %s after %d attempts (%s)", ta.Name, got.Status.Phase, got.Status.Attempts, history(got))
		}
	}
}

// The k8s-job plugin's Job runs its pods through the real Job controller.
func TestJobRunsWithTheRealJobController(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns)
	ta := containerAction(ns, "batch", 0, "echo part of a job")
	ta.Spec.TaskType = "k8s-job"
	ta.Spec.Config = map[string]string{"parallelism": "2", "completions": "2"}
	create(t, ta)
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseSucceeded {
		t.Fatalf("ended %s (%s): %+v", got.Status.Phase, history(got), got.Status.Error)
	}
	if n := len(podsOf(t, ns)); n != 2 {
		t.Fatalf("%d pods; the Job controller should have run 2", n)
	}
}

// The executor stopped while pods run, and another started: the running attempts are
// adopted, not started again, and finish.
func TestExecutorRestartWhilePodsRun(t *testing.T) {
	ns := node.Namespace(t)
	stop := startExecutor(t, ns)
	ta := containerAction(ns, "survivor", 0, "sleep 5")
	create(t, ta)
	waitPhase(t, ta, flytev1.PhaseRunning)
	stop()
	runExecutor(t, ns)
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 1 {
		t.Fatalf("ended %s after %d attempts (%s)", got.Status.Phase, got.Status.Attempts, history(got))
	}
	if pods := podsOf(t, ns); len(pods) != 1 {
		t.Fatalf("pods %v; want the one attempt's", names(pods))
	}
}

// Deleting a running action aborts its pod: the container gets SIGTERM (this one exits
// on it, well before the 30 s grace period would end it), and the action goes.
func TestAbortSendsSIGTERMToTheContainer(t *testing.T) {
	ctx := context.Background()
	ns := node.Namespace(t)
	runExecutor(t, ns)
	ta := containerAction(ns, "aborted", 0, `trap 'echo got TERM; exit 0' TERM; echo started; while true; do sleep 1; done`)
	create(t, ta)
	waitPhase(t, ta, flytev1.PhaseRunning)
	var pod corev1.Pod
	if err := node.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "aborted-1"}, &pod); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if err := node.Client.Delete(ctx, ta); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&pod, ta} {
		for {
			err := node.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Since(deleted) > 20*time.Second {
				t.Fatalf("%s still there %s after the action's deletion (err %v): the container did not get SIGTERM", obj.GetName(), time.Since(deleted).Round(time.Second), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// An attempt that runs past spec.timeout ends TimedOut, and its pod is stopped.
func TestTimeoutStopsTheRealPod(t *testing.T) {
	ctx := context.Background()
	ns := node.Namespace(t)
	runExecutor(t, ns)
	ta := containerAction(ns, "slowpoke", 0, "sleep 120")
	ta.Spec.Timeout = &metav1.Duration{Duration: 3 * time.Second}
	create(t, ta)
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseTimedOut {
		t.Fatalf("ended %s (%s); want TimedOut", got.Status.Phase, history(got))
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var pod corev1.Pod
		err := node.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "slowpoke-1"}, &pod)
		if apierrors.IsNotFound(err) || (err == nil && (pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the timed-out attempt's pod still runs: %s (err %v)", pod.Status.Phase, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The node's containerd shares the machine's network namespace (pods on the host's
// network reach the API server and Postgres on 127.0.0.1), so nothing but its registry
// configuration keeps a pull from leaving the machine: every registry, named or not,
// must be the closed port on loopback that hack/node.sh configures.
func TestPullsReachOnlyLoopback(t *testing.T) {
	ns := node.Namespace(t)
	images := []string{"docker.io/library/busybox:1.37", "registry.k8s.io/pause:3.10", "example.com/team/app:1"}
	for i, image := range images {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pull-%d", i), Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image, ImagePullPolicy: corev1.PullAlways}},
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: new(int64)},
		}
		if err := node.Client.Create(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
	}
	for i, image := range images {
		var message string
		eventually.True(t, time.Minute, func() bool {
			var pod corev1.Pod
			if err := node.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("pull-%d", i)}, &pod); err != nil {
				return false
			}
			for _, s := range pod.Status.ContainerStatuses {
				if w := s.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") && w.Message != "" {
					message = w.Message
					return true
				}
			}
			return false
		}, func() string { return "the pull of " + image + " did not fail" })
		if !strings.Contains(message, "127.0.0.1:1") {
			t.Errorf("pulling %s: %q; want a refusal from the loopback registry 127.0.0.1:1", image, message)
		}
	}
}
