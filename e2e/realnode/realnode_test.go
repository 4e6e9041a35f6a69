// Package realnode_test runs container actions on a real node (internal/nodetest): pods
// scheduled by the real scheduler and run by kubelet and containerd. Everything else
// is tested on envtest, which is faster; these tests show what a stand-in kubelet cannot.
package realnode_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/internal/nodetest"
	"github.com/flytekube/backend/internal/repo"
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
	cfg := config.Default()
	for _, c := range configure {
		c(&cfg)
	}
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.GC.Interval = metav1.Duration{}
	cfg.LeaderElect = false
	cfg.RetryBackoff.Base, cfg.RetryBackoff.Cap = metav1.Duration{Duration: 200 * time.Millisecond}, metav1.Duration{Duration: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := executor.Setup(ctx, cfg, node.Config, slog.New(slog.DiscardHandler), executor.Hooks{Namespaces: []string{ns}, SeveralInProcess: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("executor: %v", err)
		}
	})
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

// waitFinished waits until the action is finished and returns it.
func waitFinished(t *testing.T, ta *flytev1.TaskAction) *flytev1.TaskAction {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var got flytev1.TaskAction
	for {
		if err := node.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err == nil && got.Status.Phase.IsTerminal() {
			return &got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never finished; status %+v", ta.Name, got.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func history(ta *flytev1.TaskAction) string {
	var parts []string
	for _, h := range ta.Status.PhaseHistory {
		parts = append(parts, fmt.Sprintf("%s/%s@%d", h.Phase, h.Reason, h.Attempt))
	}
	return strings.Join(parts, " ")
}

func TestContainerTaskRunsAsARealPod(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns)
	ta := containerAction(ns, "hello", 0, "echo hello from $HOSTNAME")
	if err := node.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 1 {
		t.Fatalf("ended %s after %d attempts (%s); want Succeeded after 1", got.Status.Phase, got.Status.Attempts, history(got))
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
}

func TestFailingContainerRetriesInANewPod(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns)
	ta := containerAction(ns, "fails", 1, "echo failing; exit 3")
	if err := node.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Attempts != 2 || got.Status.UserFailures != 2 {
		t.Fatalf("ended %s after %d attempts, %d user failures (%s); want Failed after 2 and 2", got.Status.Phase,
			got.Status.Attempts, got.Status.UserFailures, history(got))
	}
	if e := got.Status.Error; e == nil || e.Kind != flytev1.ErrorKindUser || !strings.Contains(e.Message, "exited with 3") {
		t.Fatalf("error %+v; want the user's exit code 3", e)
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
	if err := node.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseFailed {
		t.Fatalf("ended %s (%s); want Failed", got.Status.Phase, history(got))
	}
	if e := got.Status.Error; e == nil || !strings.Contains(e.Message, "OOMKilled") {
		t.Fatalf("error %+v; want OOMKilled named", e)
	}
}

// An image the node does not have and cannot pull fails the action as the user's error
// once the pull grace period is over, rather than waiting for ever.
func TestMissingImageIsAUserError(t *testing.T) {
	ns := node.Namespace(t)
	runExecutor(t, ns, func(c *config.Config) { c.K8s.ImagePullGracePeriod = metav1.Duration{Duration: 3 * time.Second} })
	ta := containerAction(ns, "missing", 2, "true")
	ta.Spec.Container.Image = "flyte.local/not-there:1"
	if err := node.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseFailed || got.Status.Attempts != 1 {
		t.Fatalf("ended %s after %d attempts (%s); want Failed after 1: retrying cannot bring the image", got.Status.Phase, got.Status.Attempts, history(got))
	}
	if e := got.Status.Error; e == nil || e.Code != "ImagePullFailed" || e.Kind != flytev1.ErrorKindUser {
		t.Fatalf("error %+v; want the user's ImagePullFailed", e)
	}
}
