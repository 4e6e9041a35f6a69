package executor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/test/eventually"
)

func jobAction(ns, name string, retries int32) *flytev1.TaskAction {
	ta := containerAction(ns, name, retries)
	ta.Spec.TaskType = "k8s-job"
	ta.Spec.Config = map[string]string{"parallelism": "2", "completions": "2"}
	return ta
}

// waitJob waits for an attempt's Job to exist.
func waitJob(t *testing.T, ns, name string) *batchv1.Job {
	t.Helper()
	var job batchv1.Job
	eventually.True(t, 30*time.Second, func() bool {
		return env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &job) == nil
	}, func() string { return fmt.Sprintf("job %s/%s was never created", ns, name) })
	return &job
}

// jobController writes a Job's status as the Job controller would: started, then
// finished one way or the other.
func jobController(t *testing.T, job *batchv1.Job, finish batchv1.JobConditionType, reason string) {
	t.Helper()
	ctx := context.Background()
	now := metav1.Now()
	if job.Status.StartTime == nil { // immutable once set, and a second may have passed
		job.Status.StartTime = &now
	}
	job.Status.Active, job.Status.Ready = 2, ptr(int32(2))
	if err := env.Client.Status().Update(ctx, job); err != nil {
		t.Fatalf("job controller: running: %v", err)
	}
	if finish == "" {
		return
	}
	// The API server wants the interim condition (SuccessCriteriaMet, FailureTarget)
	// before the final one, and the counts to agree with it.
	interim := batchv1.JobSuccessCriteriaMet
	job.Status.Active, job.Status.Ready = 0, ptr(int32(0))
	if finish == batchv1.JobComplete {
		job.Status.Succeeded = 2
		job.Status.CompletionTime = &now
	} else {
		interim = batchv1.JobFailureTarget
		job.Status.Failed = 1
	}
	job.Status.Conditions = []batchv1.JobCondition{
		{Type: interim, Status: corev1.ConditionTrue, Reason: reason, LastTransitionTime: now},
		{Type: finish, Status: corev1.ConditionTrue, Reason: reason, Message: "as the test says", LastTransitionTime: now},
	}
	if err := env.Client.Status().Update(ctx, job); err != nil {
		t.Fatalf("job controller: finishing: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestJobTaskRunsAsAJob: the k8s-job plugin goes through the same manager as pods: its
// Job is named, labeled and owned like a pod, watched through a filtered informer, a
// failed Job is a user failure retried under a new name, and a complete one succeeds.
func TestJobTaskRunsAsAJob(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := jobAction(ns, "j0", 1)
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	first := waitJob(t, ns, "j0-1")
	if first.Labels[core.LabelManagedBy] != core.ManagedByValue || first.Labels[k8s.LabelTaskActionUID] == "" || first.Labels[core.LabelAttempt] != "1" {
		t.Fatalf("labels %v", first.Labels)
	}
	if ref := metav1.GetControllerOf(first); ref == nil || ref.Kind != "TaskAction" || ref.Name != "j0" {
		t.Fatalf("controller reference %+v", ref)
	}
	spec := first.Spec
	if *spec.Parallelism != 2 || *spec.Completions != 2 || *spec.BackoffLimit != 0 ||
		spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever || spec.Template.Spec.Containers[0].Image != "busybox:1.36" {
		t.Fatalf("job spec %+v", spec)
	}
	if req := spec.Template.Spec.Containers[0].Resources.Requests; !req.Cpu().Equal(resource.MustParse("100m")) || !req.Memory().Equal(resource.MustParse("128Mi")) {
		t.Fatalf("the Job's pods did not get the cluster's default requests: %v", req)
	}
	if _, ok := spec.Template.Labels[core.LabelManagedBy]; ok {
		t.Fatal("the Job's pods carry managed-by: the executor would cache pods it does not own")
	}

	jobController(t, first, "", "")
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	jobController(t, first, batchv1.JobFailed, "BackoffLimitExceeded")

	second := waitJob(t, ns, "j0-2")
	jobController(t, second, batchv1.JobComplete, "CompletionsReached")
	got := waitSucceeded(t, client.ObjectKeyFromObject(ta))
	if got.Status.Attempts != 2 || got.Status.SystemFailures != 0 {
		t.Fatalf("attempts %d, system failures %d; want 2 and 0", got.Status.Attempts, got.Status.SystemFailures)
	}
	var retried bool
	for _, h := range got.Status.PhaseHistory {
		retried = retried || (h.Reason == flytev1.ReasonAttemptFailed && h.Error != nil && h.Error.Code == "BackoffLimitExceeded")
	}
	if !retried {
		t.Fatalf("history %+v; want a retry caused by BackoffLimitExceeded", got.Status.PhaseHistory)
	}
}

// TestBadJobConfigFailsAtOnce: settings the plugin cannot use are the user's error.
func TestBadJobConfigFailsAtOnce(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := jobAction(ns, "j1", 3)
	ta.Spec.Config["parallelism"] = "lots"
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseFailed)
	var got flytev1.TaskAction
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Error == nil || got.Status.Error.Code != "BadTaskSpec" || got.Status.Attempts != 1 {
		t.Fatalf("status %+v; want one attempt failed with BadTaskSpec", got.Status)
	}
}
