package executor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/plugins/k8s/job"
)

// jobPodStarted plays the Job controller starting one pod of job, left Pending: it
// creates the pod from the template, labeled as the Job's selector wants and controlled
// by the Job, then counts it active, none ready, in the Job's status. It returns the pod.
func jobPodStarted(t *testing.T, j *batchv1.Job) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if j.Spec.Selector == nil || j.Spec.Selector.MatchLabels[batchv1.ControllerUidLabel] != string(j.UID) {
		t.Fatalf("the API server did not set the Job's selector: %+v", j.Spec.Selector)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: j.Name + "-x7k2p", Namespace: j.Namespace, Labels: j.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))},
		},
		Spec: j.Spec.Template.Spec,
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("job controller: creating a pod: %v", err)
	}
	now := metav1.Now()
	j.Status.StartTime = &now
	j.Status.Active, j.Status.Ready = 1, ptr(int32(0))
	if err := env.Client.Status().Update(ctx, j); err != nil {
		t.Fatalf("job controller: pods pending: %v", err)
	}
	return pod
}

// secretJobAction is a k8s-job action of one pod with secrets.
func secretJobAction(ns, name string, secrets []flytev1.TaskSecret) *flytev1.TaskAction {
	ta := jobAction(ns, name, 3)
	ta.Spec.Config = nil // one pod
	ta.Spec.Secrets = secrets
	return ta
}

// TestMissingSecretOfAVariableFailsTheJob: the Job's pod waits with
// CreateContainerConfigError for a Secret's key that does not exist. The Job's status
// only says a pod is pending, and the pod's status wakes no action, so the executor
// reads the Job's pods while they wait; the action fails at once, naming the Secret.
func TestMissingSecretOfAVariableFailsTheJob(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, secretGrace(0), ns, &count)
	ta := secretJobAction(ns, "js0", taskSecrets[:1])
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	pod := jobPodStarted(t, waitJob(t, ns, "js0-1"))
	waitReason(t, client.ObjectKeyFromObject(ta), job.ReasonPodsPending)
	settled(t, &count) // only a recheck can see the pod's status now

	message := "couldn't find key password in Secret " + ns + "/db"
	kubeletWaiting(t, pod, "CreateContainerConfigError", message)
	got := waitFailed(t, client.ObjectKeyFromObject(ta))
	checkMissingSecret(t, got, `container task cannot start: Secret "db" key "password" does not exist (spec.secrets[0], env DB_PASSWORD)`,
		"CreateContainerConfigError: "+message)
}

// TestMissingSecretOfAVolumeFailsTheJob: the Job's pod cannot mount a Secret that does
// not exist, which only the kubelet's FailedMount events about the pod say (not the
// Job's events, which the manager reads). The executor reads them while the pod may be
// mounting, and the action fails naming the Secret.
func TestMissingSecretOfAVolumeFailsTheJob(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, secretGrace(0), ns, &count)
	ta := secretJobAction(ns, "js1", taskSecrets[2:])
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := jobPodStarted(t, waitJob(t, ns, "js1-1"))
	pod = kubeletWaiting(t, pod, "ContainerCreating", "")
	waitReason(t, client.ObjectKeyFromObject(ta), job.ReasonPodsPending)
	settled(t, &count)

	message := `MountVolume.SetUp failed for volume "flyte-secret-0" : secret "tls" not found`
	kubeletFailedMount(t, pod, message)
	got := waitFailed(t, client.ObjectKeyFromObject(ta))
	checkMissingSecret(t, got, fmt.Sprintf(`pod %s cannot start: Secret "tls" does not exist (spec.secrets[0], mountPath /etc/tls)`, pod.Name),
		"FailedMount: "+message)
}
