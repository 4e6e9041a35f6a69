package executor_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// TestTimeoutDeletesThePodAndMakesNoOther: an attempt that runs past spec.timeout ends
// the action TimedOut with its pod deleted, and nothing makes a second pod, neither
// while the first terminates in its grace period nor after it is gone (upstream's
// executor left the pod to be made again, flyte#7910).
func TestTimeoutDeletesThePodAndMakesNoOther(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	restConfig, rec := recordingConfig()
	start(t, testConfig(), ns, runOptions{restConfig: restConfig})
	ta := containerAction(ns, "slow", 2)
	ta.Spec.Timeout = &metav1.Duration{Duration: 2 * time.Second}
	create(t, ta)
	pod := bindAndRun(t, ta, "slow-1")

	got := waitFailedAs(t, client.ObjectKeyFromObject(ta), flytev1.PhaseTimedOut)
	if got.Status.Attempts != 1 || got.Status.Error == nil || got.Status.Error.Code != "Timeout" {
		t.Fatalf("status %+v; want one attempt timed out", got.Status)
	}
	var terminating corev1.Pod
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &terminating); err != nil {
		t.Fatal(err)
	}
	if terminating.DeletionTimestamp == nil {
		t.Fatal("the timed-out attempt's pod was not deleted")
	}
	time.Sleep(2 * time.Second) // a pass or two while the pod is in its grace period
	// The kubelet finishes the deletion.
	if err := env.Client.Delete(ctx, &terminating, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	waitGone(t, &terminating)
	time.Sleep(2 * time.Second)

	if c, d := rec.count("POST pods"), rec.count("DELETE pods"); c != 1 || d != 1 {
		t.Fatalf("%d creates and %d deletes of pods; want one of each", c, d)
	}
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
		t.Fatalf("%d pods left (%v); want none", len(pods.Items), err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ta), got); err != nil || got.Status.Phase != flytev1.PhaseTimedOut || got.Status.Attempts != 1 {
		t.Fatalf("status %+v (%v); want still TimedOut after one attempt", got.Status, err)
	}
}

// waitFailedAs waits for the action to end in phase and returns it.
func waitFailedAs(t *testing.T, key client.ObjectKey, phase flytev1.Phase) *flytev1.TaskAction {
	t.Helper()
	waitPhase(t, key, phase)
	var ta flytev1.TaskAction
	if err := env.Client.Get(context.Background(), key, &ta); err != nil {
		t.Fatal(err)
	}
	return &ta
}
