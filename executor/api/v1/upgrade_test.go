package v1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
)

// executorFinalizer is the finalizer the executor puts on every action it runs
// (executor/controller.Finalizer).
const executorFinalizer = "flyte.org/plugin-finalizer"

// TestActionsStoredBeforeTheSizeLimitsCanStillEnd: the size limits tighten the schema of
// a CRD that clusters already hold actions of. An action stored under the looser schema
// (testdata: the CRD as it was before the limits) with an argument past them must still
// take the executor's status writes and lose its finalizer once the new CRD is applied,
// or it would be stranded, never ending and never deleted. The API server ratchets:
// a field an update leaves unchanged is not validated again (CRDValidationRatcheting, on
// and locked since Kubernetes 1.33), and the spec cannot change.
func TestActionsStoredBeforeTheSizeLimitsCanStillEnd(t *testing.T) {
	// A control plane of its own: the other tests need the CRD as it is now.
	plane, err := kubetest.Start(kubetest.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := plane.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	c := plane.Client

	var before, after apiextensionsv1.CustomResourceDefinition
	if err := repo.ReadYAML(&before, "executor", "api", "v1", "testdata", "taskactions-before-size-limits.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := repo.ReadYAML(&after, "deploy", "crd", "flyte.org_taskactions.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx(t), &before); err != nil {
		t.Fatalf("installing the CRD as it was: %v", err)
	}
	waitEstablished(t, c, before.Name)

	ns := kubetest.Namespace(t, c)
	big := strings.Repeat("x", 1300<<10)
	old := sample(t, ns)
	old.Name = "stored-before"
	old.Finalizers = []string{executorFinalizer}
	old.Spec.Config = nil
	old.Spec.Container = &flytev1.ContainerSpec{Image: "busybox", Args: []string{big}}
	if err := c.Create(ctx(t), old); err != nil {
		t.Fatalf("the looser schema refused an action of a 1.3 MB argument: %v", err)
	}

	// Apply the CRD with the limits, and wait until the API server enforces them: a new
	// action like the stored one is refused.
	var installed apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx(t), client.ObjectKey{Name: after.Name}, &installed); err != nil {
		t.Fatal(err)
	}
	installed.Spec = after.Spec
	if err := c.Update(ctx(t), &installed); err != nil {
		t.Fatalf("applying the CRD with the limits: %v", err)
	}
	probe := 0
	err = wait.PollUntilContextTimeout(ctx(t), 50*time.Millisecond, 25*time.Second, true, func(ctx context.Context) (bool, error) {
		probe++
		fresh := sample(t, ns)
		fresh.Name = fmt.Sprintf("probe-%d", probe)
		fresh.Spec.Config = nil
		fresh.Spec.Container = old.Spec.Container
		switch err := c.Create(ctx, fresh); {
		case err == nil: // still the looser schema
			return false, nil
		case apierrors.IsInvalid(err):
			return true, nil
		default:
			return false, err
		}
	})
	if err != nil {
		t.Fatalf("the API server never enforced the new limits: %v", err)
	}

	// The executor's writes of an action it runs, as it makes them: the status through
	// the status subresource, the finalizer by a merge patch under optimistic locking.
	now := metav1.Now()
	var stored flytev1.TaskAction
	if err := c.Get(ctx(t), client.ObjectKeyFromObject(old), &stored); err != nil {
		t.Fatal(err)
	}
	stored.Status = flytev1.TaskActionStatus{
		Phase: flytev1.PhaseRunning, Attempts: 1,
		PhaseHistory: []flytev1.PhaseTransition{{Phase: flytev1.PhaseRunning, Attempt: 1, OccurredAt: metav1.NewMicroTime(now.Time)}},
	}
	if err := c.Status().Update(ctx(t), &stored); err != nil {
		t.Fatalf("writing the status of an action stored before the limits: %v", err)
	}
	if err := c.Delete(ctx(t), &stored); err != nil {
		t.Fatalf("deleting it: %v", err)
	}
	if err := c.Get(ctx(t), client.ObjectKeyFromObject(old), &stored); err != nil || stored.DeletionTimestamp == nil {
		t.Fatalf("after the delete: %v, deletionTimestamp %v; want it held by the finalizer", err, stored.DeletionTimestamp)
	}
	stored.Status.Phase = flytev1.PhaseAborted
	stored.Status.PhaseHistory = append(stored.Status.PhaseHistory,
		flytev1.PhaseTransition{Phase: flytev1.PhaseAborted, Attempt: 1, OccurredAt: metav1.NewMicroTime(now.Time)})
	if err := c.Status().Update(ctx(t), &stored); err != nil {
		t.Fatalf("writing the status of a deleted action stored before the limits: %v", err)
	}
	patch := client.MergeFromWithOptions(stored.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(&stored, executorFinalizer)
	if err := c.Patch(ctx(t), &stored, patch); err != nil {
		t.Fatalf("removing the finalizer of an action stored before the limits: %v", err)
	}
	if err := c.Get(ctx(t), client.ObjectKeyFromObject(old), &stored); !apierrors.IsNotFound(err) {
		t.Fatalf("after its finalizer went: %v; want it gone", err)
	}
}

func waitEstablished(t *testing.T, c client.Client, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx(t), 50*time.Millisecond, 25*time.Second, true, func(ctx context.Context) (bool, error) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			return false, err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not established: %v", name, err)
	}
}
