package executor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/plugin"
)

// TestPodInformerHoldsOnlyManagedPods: the executor's cache must not grow with the
// cluster's pods.
func TestPodInformerHoldsOnlyManagedPods(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	_, mgr := start(t, testConfig(), ns, runOptions{})
	pod := func(name string, labels map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}}}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	managed := pod("managed", map[string]string{plugin.LabelManagedBy: plugin.ManagedByValue})
	other := pod("someone-elses", map[string]string{"app": "web"})

	deadline := time.Now().Add(30 * time.Second)
	for mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(managed), &corev1.Pod{}) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the managed pod never reached the cache")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(other), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("an unmanaged pod is in the executor's cache: %v", err)
	}
}

// TestTerminatingPodCostsConstantWrites: however often a terminating pod's status
// changes during its grace period, the action is written a bounded number of times.
func TestTerminatingPodCostsConstantWrites(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	restConfig, rec := recordingConfig()
	var reconciles atomic.Int64
	start(t, testConfig(), ns, runOptions{count: &reconciles, restConfig: restConfig})

	ta := containerAction(ns, "t0", 0)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, ns, "t0-1")
	if err := env.Client.SubResource("binding").Create(ctx, p, &corev1.Binding{Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}); err != nil {
		t.Fatal(err)
	}
	p = waitPod(t, ns, "t0-1")
	kubelet(t, p, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the executor records Terminating
	before := rec.writes("taskactions")
	// The kubelet keeps updating the terminating pod (probes, conditions).
	for i := range 20 {
		p = waitPod(t, ns, "t0-1")
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "Probe" + string(rune('a'+i))}}
		if err := env.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if w := rec.writes("taskactions") - before; w > 1 {
		t.Fatalf("%d TaskAction writes for 20 updates of a terminating pod; want at most 1", w)
	}
}
