package executor_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/eventually"
)

// TestInformersHoldOnlyManagedObjects: the executor's cache of the kinds its plugins
// create must not grow with the cluster's objects of those kinds.
func TestInformersHoldOnlyManagedObjects(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	_, mgr := start(t, testConfig(), ns, runOptions{})
	podSpec := corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}}
	for _, tc := range []struct {
		kind string
		make func(name string, labels map[string]string) client.Object
	}{
		{"Pod", func(name string, labels map[string]string) client.Object {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: podSpec}
		}},
		{"Job", func(name string, labels map[string]string) client.Object {
			return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
				Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: podSpec}}}
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			managed := tc.make("managed-"+strings.ToLower(tc.kind), map[string]string{core.LabelManagedBy: core.ManagedByValue})
			other := tc.make("someone-elses-"+strings.ToLower(tc.kind), map[string]string{"app": "web"})
			for _, obj := range []client.Object{managed, other} {
				if err := env.Client.Create(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}
			empty := func() client.Object { return tc.make("", nil) }
			eventually.True(t, 30*time.Second, func() bool {
				return mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(managed), empty()) == nil
			}, func() string { return "the managed " + tc.kind + " never reached the cache" })
			if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(other), empty()); !apierrors.IsNotFound(err) {
				t.Fatalf("an unmanaged %s is in the executor's cache: %v", tc.kind, err)
			}
		})
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

// TestCacheHoldsNoManagedFields: the executor never reads an object's managed fields,
// and they are nearly half of a TaskAction's bytes, so its cache holds none: not of its
// actions, nor of its pods. The API server keeps them.
func TestCacheHoldsNoManagedFields(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	_, mgr := start(t, testConfig(), ns, runOptions{})
	ta := containerAction(ns, "kept", 0)
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	eventually.True(t, 30*time.Second, func() bool {
		return mgr.GetCache().Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept-1"}, pod) == nil
	}, func() string { return "the action's pod never reached the cache" })
	cached := &flytev1.TaskAction{}
	if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(ta), cached); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{cached, pod} {
		if n := len(obj.GetManagedFields()); n != 0 {
			t.Errorf("the cached %T %s holds %d managed-fields entries; want none", obj, obj.GetName(), n)
		}
	}
	stored := &flytev1.TaskAction{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ta), stored); err != nil || len(stored.GetManagedFields()) == 0 {
		t.Fatalf("the API server's copy has %d managed-fields entries (%v); want them kept", len(stored.GetManagedFields()), err)
	}
}
