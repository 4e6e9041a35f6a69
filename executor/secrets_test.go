package executor_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/test/eventually"
)

// taskSecrets are the three ways to ask for a Secret: a key as a variable, a key as a
// file, every key as files.
var taskSecrets = []flytev1.TaskSecret{
	{Name: "db", Key: "password", Env: "DB_PASSWORD"},
	{Name: "db", Key: "password", MountPath: "/etc/db"},
	{Name: "tls", MountPath: "/etc/tls"},
}

// checkSecretReferences checks that a task's pod spec refers to taskSecrets in its task
// container, as the kubelet needs them: never optional, files read-only and 0444.
func checkSecretReferences(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("containers %+v, init containers %+v", spec.Containers, spec.InitContainers)
	}
	c := spec.Containers[0]
	var env *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "DB_PASSWORD" {
			env = &c.Env[i]
		}
	}
	if env == nil || env.Value != "" || env.ValueFrom == nil || env.ValueFrom.SecretKeyRef == nil {
		t.Fatalf("DB_PASSWORD is %+v; want a reference to a Secret's key", env)
	}
	if ref := env.ValueFrom.SecretKeyRef; ref.Name != "db" || ref.Key != "password" || ref.Optional == nil || *ref.Optional {
		t.Fatalf("DB_PASSWORD refers to %+v", ref)
	}
	volumes := map[string]*corev1.SecretVolumeSource{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			volumes[v.Name] = v.Secret
		}
	}
	want := map[string]struct{ secret, items string }{"/etc/db": {"db", "password=password"}, "/etc/tls": {"tls", ""}}
	if len(volumes) != len(want) {
		t.Fatalf("secret volumes %+v; want %d", volumes, len(want))
	}
	for _, m := range c.VolumeMounts {
		w, ok := want[m.MountPath]
		if !ok {
			continue
		}
		delete(want, m.MountPath)
		v := volumes[m.Name]
		var items []string
		for _, it := range v.Items {
			items = append(items, it.Key+"="+it.Path)
		}
		switch {
		case v == nil || !m.ReadOnly:
			t.Fatalf("%s mounts %+v from %+v", m.MountPath, m, v)
		case v.SecretName != w.secret || strings.Join(items, ",") != w.items:
			t.Fatalf("%s mounts Secret %s items %v; want %s items %q", m.MountPath, v.SecretName, items, w.secret, w.items)
		case v.DefaultMode == nil || *v.DefaultMode != 0o444 || v.Optional == nil || *v.Optional:
			t.Fatalf("%s: mode %v, optional %v", m.MountPath, v.DefaultMode, v.Optional)
		}
	}
	if len(want) != 0 {
		t.Fatalf("not mounted: %v (mounts %+v)", want, c.VolumeMounts)
	}
}

// TestSecretsReachTheTasksPod: the container plugin's pod refers to the action's secrets
// for the kubelet to fetch, and the executor never reads a Secret, even one that exists.
func TestSecretsReachTheTasksPod(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	for _, name := range []string{"db", "tls"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: map[string]string{"password": "hunter2"}}
		if err := env.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	restConfig, rec := recordingConfig()
	var count atomic.Int64
	start(t, testConfig(), ns, runOptions{count: &count, restConfig: restConfig})
	ta := containerAction(ns, "s0", 0)
	ta.Spec.Secrets = taskSecrets
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "s0-1")
	checkSecretReferences(t, pod.Spec)
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	waitSucceeded(t, client.ObjectKeyFromObject(ta))
	if n := rec.count("GET secrets"); n != 0 || rec.count("GET pods") == 0 {
		t.Fatalf("the executor read Secrets %d times (and pods %d times)", n, rec.count("GET pods"))
	}
}

// TestSecretsReachTheJobsPods: the k8s-job plugin's pods refer to them alike.
func TestSecretsReachTheJobsPods(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)
	ta := jobAction(ns, "s1", 0)
	ta.Spec.Secrets = taskSecrets
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	job := waitJob(t, ns, "s1-1")
	checkSecretReferences(t, job.Spec.Template.Spec)
}

// kubeletWaiting binds a pod to a node, as the scheduler would, and writes its status as
// the kubelet does while it cannot start the task's container: Pending, the container
// waiting for reason. It returns the pod as written.
func kubeletWaiting(t *testing.T, pod *corev1.Pod, reason, message string) *corev1.Pod {
	t.Helper()
	pod = bind(t, pod)
	now := metav1.Now()
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: flytek8s.ContainerName, Image: "busybox:1.36",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}}
	if err := env.Client.Status().Update(context.Background(), pod); err != nil {
		t.Fatalf("kubelet: %v", err)
	}
	return pod
}

// settled waits until the executor has not reconciled for a second.
func settled(t *testing.T, count *atomic.Int64) {
	t.Helper()
	last := count.Load()
	eventually.True(t, 30*time.Second, func() bool {
		time.Sleep(time.Second)
		n := count.Load()
		defer func() { last = n }()
		return n == last
	}, func() string { return "the executor kept reconciling" })
}

// waitFailed waits for an action to fail and returns it.
func waitFailed(t *testing.T, key client.ObjectKey) *flytev1.TaskAction {
	t.Helper()
	return waitFailedAs(t, key, flytev1.PhaseFailed)
}

// checkMissingSecret checks that an action failed once, for good, as the user's error,
// with a message holding want, despite retries left.
func checkMissingSecret(t *testing.T, ta *flytev1.TaskAction, want ...string) {
	t.Helper()
	e := ta.Status.Error
	if e == nil || e.Code != flytek8s.CodeMissingSecret || e.Kind != flytev1.ErrorKindUser || ta.Status.Attempts != 1 {
		t.Fatalf("status %+v; want one attempt failed with %s, a user error", ta.Status, flytek8s.CodeMissingSecret)
	}
	for _, w := range want {
		if !strings.Contains(e.Message, w) {
			t.Fatalf("message %q; want it to say %q", e.Message, w)
		}
	}
}

// secretGrace is testConfig with the missing-Secret grace period given.
func secretGrace(grace time.Duration) config.Config {
	cfg := testConfig()
	cfg.K8s.MissingSecretGracePeriod = metav1.Duration{Duration: grace}
	return cfg
}

// TestMissingSecretOfAVariableFailsTheAction: the kubelet cannot set DB_PASSWORD and says
// so in the container's status; the action waits out the grace period (a Secret synced
// by a controller may appear moments later), saying why, then fails, naming the Secret
// and key, instead of waiting for a Secret nobody may ever create.
func TestMissingSecretOfAVariableFailsTheAction(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	const grace = 4 * time.Second
	run(t, secretGrace(grace), ns, &count)
	ta := containerAction(ns, "s2", 3)
	ta.Spec.Secrets = taskSecrets[:1]
	if err := env.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "s2-1")
	kubeletWaiting(t, pod, "CreateContainerConfigError", "couldn't find key password in Secret "+ns+"/db")
	waitReason(t, client.ObjectKeyFromObject(ta), flytek8s.ReasonWaitingForSecret)
	got := waitFailed(t, client.ObjectKeyFromObject(ta))
	// Timestamps are whole seconds.
	if waited := got.Status.CompletedAt.Sub(pod.CreationTimestamp.Time); waited < grace-time.Second {
		t.Errorf("the action failed %s after its pod was created; the grace period is %s", waited, grace)
	}
	checkMissingSecret(t, got, `Secret "db" key "password" does not exist (spec.secrets[0], env DB_PASSWORD)`,
		"CreateContainerConfigError: couldn't find key password in Secret "+ns+"/db")
}

// TestMissingSecretOfAVolumeFailsTheAction: a Secret volume that cannot be mounted leaves
// the pod Pending, its container "ContainerCreating", and only the kubelet's FailedMount
// events say why. Events do not wake an action, so the executor looks for them again
// while the pod waits; the action fails naming the Secret, with the event in its history.
func TestMissingSecretOfAVolumeFailsTheAction(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, secretGrace(0), ns, &count)
	ta := containerAction(ns, "s3", 3)
	ta.Spec.Secrets = taskSecrets[2:]
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "s3-1")
	pod = kubeletWaiting(t, pod, "ContainerCreating", "")
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseInitializing)
	settled(t, &count) // the passes the pod's changes caused are over: only a recheck can see the event

	// Then the kubelet's first mount attempt fails: an Event, which changes nothing the
	// executor watches.
	message := `MountVolume.SetUp failed for volume "flyte-secret-0" : secret "tls" not found`
	kubeletFailedMount(t, pod, message)
	var got flytev1.TaskAction
	eventually.True(t, 30*time.Second, func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(ta), &got) == nil && got.Status.Phase == flytev1.PhaseFailed
	}, func() string { return fmt.Sprintf("status %+v", got.Status) })
	checkMissingSecret(t, &got, `pod s3-1 cannot start: Secret "tls" does not exist (spec.secrets[0], mountPath /etc/tls)`, "FailedMount: "+message)
	last, _ := got.Status.PhaseHistory.Last()
	var reported bool
	for _, e := range last.ClusterEvents {
		reported = reported || e.Reason == "FailedMount" && e.Message == message && e.Source == "kubelet"
	}
	if !reported {
		t.Fatalf("the failure's history entry carries events %+v; want the kubelet's FailedMount", last.ClusterEvents)
	}
}

// kubeletFailedMount records the Warning event the kubelet writes about pod when it
// cannot mount one of its volumes.
func kubeletFailedMount(t *testing.T, pod *corev1.Pod, message string) {
	t.Helper()
	now := metav1.Now()
	event := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod.Name, time.Now().UnixNano()), Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1",
			ResourceVersion: pod.ResourceVersion},
		Type: corev1.EventTypeWarning, Reason: "FailedMount", Message: message,
		Source: corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := env.Client.Create(context.Background(), event); err != nil {
		t.Fatal(err)
	}
}
