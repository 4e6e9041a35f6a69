package executor_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// TestInterruptibleFallsBackToOnDemand: with k8s.interruptibleFailureThreshold 1, an
// interruptible action's first pod goes to preemptible capacity; once it is preempted (a
// system failure), the next attempt's pod has neither the interruptible toleration nor
// the node selector, and the action's history says why.
func TestInterruptibleFallsBackToOnDemand(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.K8s.InterruptibleTolerations = []corev1.Toleration{{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	cfg.K8s.InterruptibleNodeSelector = map[string]string{"node.example.com/spot": "true"}
	cfg.K8s.InterruptibleFailureThreshold = 1
	var count atomic.Int64
	run(t, cfg, ns, &count)
	ta := containerAction(ns, "i0", 0)
	ta.Spec.Interruptible = true
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}

	spot := func(pod *corev1.Pod) (toleration, selector bool) {
		return slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool { return t.Key == "spot" }),
			pod.Spec.NodeSelector["node.example.com/spot"] == "true"
	}
	first := waitPod(t, ns, "i0-1")
	if toleration, selector := spot(first); !toleration || !selector {
		t.Fatalf("attempt 1: toleration %v, node selector %v; want both: no system failure yet", first.Spec.Tolerations, first.Spec.NodeSelector)
	}

	// The scheduler preempts it: the pod is marked a disruption target, and the kubelet
	// stops it (SIGKILL after the grace period).
	first.Status.Phase = corev1.PodFailed
	first.Status.Conditions = append(first.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: "PreemptionByScheduler", Message: "Preempted in order to admit critical pod", LastTransitionTime: metav1.Now()})
	first.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: flytek8s.ContainerName, Image: "busybox:1.36",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}}}
	if err := env.Client.Status().Update(ctx, first); err != nil {
		t.Fatal(err)
	}

	second := waitPod(t, ns, "i0-2")
	if toleration, selector := spot(second); toleration || selector {
		t.Fatalf("attempt 2: tolerations %v, node selector %v; want neither after the threshold's system failure",
			second.Spec.Tolerations, second.Spec.NodeSelector)
	}
	kubelet(t, second, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	if got.Status.Attempts != 2 || got.Status.SystemFailures != 1 {
		t.Fatalf("attempts %d, system failures %d; want 2 and 1", got.Status.Attempts, got.Status.SystemFailures)
	}
	const why = "runs on on-demand capacity: 1 system failure reached k8s.interruptibleFailureThreshold 1"
	var said bool
	for _, h := range got.Status.PhaseHistory {
		if strings.Contains(h.Message, why) {
			if h.Attempt != 2 {
				t.Fatalf("history entry %+v says why under attempt %d; want attempt 2", h, h.Attempt)
			}
			said = true
			t.Logf("attempt 2's history: %s", h.Message)
		}
	}
	if !said {
		t.Fatalf("no history entry says %q: %+v", why, got.Status.PhaseHistory)
	}
}
