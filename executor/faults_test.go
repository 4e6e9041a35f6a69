package executor_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
)

// TestAPIErrorsRetryWithoutSpendingBudgets: an API server that throttles, fails or loses
// the reply to a create is the platform having a bad moment, not the task failing: the
// executor backs off and tries again, spends neither budget, and ends with one pod.
func TestAPIErrorsRetryWithoutSpendingBudgets(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	restConfig, rec := recordingConfig()
	rec.inject("POST pods",
		fault{status: http.StatusTooManyRequests},
		fault{status: http.StatusInternalServerError},
		fault{status: http.StatusServiceUnavailable},
		fault{lostReply: true}, // the pod is made, the executor does not hear of it
	)
	start(t, testConfig(), ns, runOptions{restConfig: restConfig})

	ta := containerAction(ns, "f0", 0)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := bind(t, waitPod(t, ns, "f0-1"))
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseInitializing) // the pod is pending on its node
	rec.inject("PUT taskactions/status", fault{status: http.StatusGatewayTimeout})
	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	pod = waitPod(t, ns, "f0-1")
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))

	if got.Status.Attempts != 1 || got.Status.SystemFailures != 0 {
		t.Fatalf("attempts %d, system failures %d; want 1 and 0: API errors are not the action's failures",
			got.Status.Attempts, got.Status.SystemFailures)
	}
	for _, h := range got.Status.PhaseHistory {
		if h.Error != nil {
			t.Fatalf("history %+v records an error", h)
		}
	}
	if n := rec.count("POST pods"); n != 1 {
		t.Fatalf("%d creates reached the API server; want 1 (the lost reply's), then adoption", n)
	}
}

// podKubelet plays the kubelet for every pod of a namespace: it binds each new pod to a
// node, starts it and finishes it at once, as a fast cluster would.
func podKubelet(ctx context.Context, t *testing.T, ns string) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		done := map[string]bool{}
		for ctx.Err() == nil {
			var pods corev1.PodList
			if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				if done[p.Name] || p.DeletionTimestamp != nil {
					continue
				}
				if p.Spec.NodeName == "" {
					if err := env.Client.SubResource("binding").Create(ctx, p, &corev1.Binding{Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}); err != nil {
						continue
					}
					if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
						continue
					}
				}
				p.Status.Phase = corev1.PodSucceeded
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "task", Image: "busybox:1.36",
					State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}}
				if err := env.Client.Status().Update(ctx, p); err == nil {
					done[p.Name] = true
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return &wg
}

// TestOneCreatePerAttempt: however the reconciles of an action interleave with the
// events of its pod (binding, status) and the informer's lag, each attempt's pod is
// created exactly once. A second create would fail with AlreadyExists, yet the quota
// admission would already have charged it.
func TestOneCreatePerAttempt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.Namespace(t)
	restConfig, rec := recordingConfig()
	start(t, testConfig(), ns, runOptions{restConfig: restConfig})
	kubeletDone := podKubelet(ctx, t, ns)

	const actions = 60
	for i := range actions {
		if err := env.Client.Create(ctx, containerAction(ns, fmt.Sprintf("one-%d", i), 0)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range actions {
		if got := waitSucceeded(t, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("one-%d", i)}); got.Status.Attempts != 1 {
			t.Fatalf("%s took %d attempts", got.Name, got.Status.Attempts)
		}
	}
	cancel()
	kubeletDone.Wait()
	if n := rec.count("POST pods"); n != actions {
		t.Fatalf("%d pod creates for %d single-attempt actions", n, actions)
	}
}

// TestAbortDeletesThePod: deleting a running container action deletes its pod (once)
// and the action goes; nothing new is started.
func TestAbortDeletesThePod(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	restConfig, rec := recordingConfig()
	start(t, testConfig(), ns, runOptions{restConfig: restConfig})
	ta := containerAction(ns, "ab0", 2)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := bindAndRun(t, ta, "ab0-1")

	if err := env.Client.Delete(ctx, ta); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ta)
	var after corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &after); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	} else if err == nil && after.DeletionTimestamp == nil {
		t.Fatal("the aborted action's pod was not deleted")
	}
	if c, d := rec.count("POST pods"), rec.count("DELETE pods"); c != 1 || d != 1 {
		t.Fatalf("%d creates and %d deletes of pods; want one of each", c, d)
	}
}

// TestDeletingWhileThePodTerminates: an action deleted while its pod is already in its
// grace period (preempted, say) goes cleanly: no new attempt, no second pod, no loop.
func TestDeletingWhileThePodTerminates(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	restConfig, rec := recordingConfig()
	var reconciles atomic.Int64
	start(t, testConfig(), ns, runOptions{restConfig: restConfig, count: &reconciles})
	ta := containerAction(ns, "ab1", 2)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := bindAndRun(t, ta, "ab1-1")
	if err := env.Client.Delete(ctx, pod); err != nil { // graceful: the pod stays, terminating
		t.Fatal(err)
	}
	waitReason(t, client.ObjectKeyFromObject(ta), "Terminating")

	if err := env.Client.Delete(ctx, ta); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ta)
	time.Sleep(300 * time.Millisecond)
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || pods.Items[0].DeletionTimestamp == nil || rec.count("POST pods") != 1 {
		t.Fatalf("%d pods, %d creates; want only the terminating pod", len(pods.Items), rec.count("POST pods"))
	}
	if n := reconciles.Load(); n > 20 {
		t.Fatalf("%d reconciles for one action's short life; something loops", n)
	}
}

// bindAndRun waits for the attempt's pod, binds it to a node and starts it, and waits
// for the action to say Running.
func bindAndRun(t *testing.T, ta *flytev1.TaskAction, podName string) *corev1.Pod {
	t.Helper()
	pod := bind(t, waitPod(t, ta.Namespace, podName))
	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	return pod
}

// bind puts a pod on a node, as the scheduler would, and returns it as bound.
func bind(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if err := env.Client.SubResource("binding").Create(context.Background(), pod, &corev1.Binding{Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}); err != nil {
		t.Fatalf("binding: %v", err)
	}
	return waitPod(t, pod.Namespace, pod.Name)
}

// waitReason waits for the action's Progressing condition to give reason.
func waitReason(t *testing.T, key client.ObjectKey, reason string) {
	t.Helper()
	eventually.True(t, 30*time.Second, func() bool {
		var ta flytev1.TaskAction
		if env.Client.Get(context.Background(), key, &ta) != nil {
			return false
		}
		c := findProgressing(&ta)
		return c != nil && c.Reason == reason
	}, func() string { return fmt.Sprintf("%s never said %s", key, reason) })
}

// waitGone waits for the object to be deleted for good.
func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	eventually.True(t, 30*time.Second, func() bool {
		return apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj))
	}, func() string {
		return fmt.Sprintf("%s/%s was never deleted; finalizers %v", obj.GetNamespace(), obj.GetName(), obj.GetFinalizers())
	})
}
