package container_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/plugins/k8s/container"
)

var dbSecrets = []flytev1.TaskSecret{
	{Name: "db", Key: "password", Env: "DB_PASSWORD"},
	{Name: "tls", MountPath: "/etc/tls"},
}

// TestSecretsInThePod: the task's container gets spec.secrets as references, after the
// executor's own variables and mounts, which they may not shadow.
func TestSecretsInThePod(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := datastore.Confine(datastore.New(), []string{"file://" + dir})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		secrets []flytev1.TaskSecret
		env     []corev1.EnvVar // spec.container.env
		wantErr string
	}{
		{name: "env and a volume", secrets: dbSecrets},
		{name: "a variable the task's env sets", secrets: dbSecrets, env: []corev1.EnvVar{{Name: "DB_PASSWORD", Value: "x"}},
			wantErr: "env DB_PASSWORD is already set in container task"},
		{name: "a path inside the mounted outputs", secrets: []flytev1.TaskSecret{{Name: "db", MountPath: filepath.Join(dir, "r1", "a0", "1", "db")}},
			wantErr: "where container task mounts " + flytek8s.OutputsVolume},
		{name: "a path around the mounted data", secrets: []flytev1.TaskSecret{{Name: "db", MountPath: dir}},
			wantErr: "where container task mounts " + flytek8s.OutputsVolume},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{UID: "uid"}, Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "file://" + dir + "/r1",
				Container: &flytev1.ContainerSpec{Image: "busybox", Env: tt.env}, Secrets: tt.secrets}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: store})
			obj, err := container.New(k8s.Config{MountFileStorage: true}, nil).BuildResource(ctx, tCtx)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v; want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := obj.(*corev1.Pod).Spec.Containers[0]
			last := c.Env[len(c.Env)-1]
			if ref := last.ValueFrom; last.Name != "DB_PASSWORD" || ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "db" || ref.SecretKeyRef.Key != "password" {
				t.Fatalf("last variable %+v", last)
			}
			var mounted bool
			for _, m := range c.VolumeMounts {
				mounted = mounted || m.MountPath == "/etc/tls" && m.ReadOnly
			}
			if !mounted {
				t.Fatalf("mounts %+v", c.VolumeMounts)
			}
		})
	}
}

// onNode is a pod on its node whose task container waits for reason.
func onNode(reason, message string, conditions ...corev1.PodCondition) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a0-1", CreationTimestamp: metav1.NewTime(now.Add(-time.Second))},
		Spec: corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: conditions, ContainerStatuses: []corev1.ContainerStatus{{
			Name: flytek8s.ContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}}}}
}

// TestMissingSecretFailsTheAttempt: a Secret or key that does not exist fails the attempt
// for good, as the user's error naming it, whether the kubelet says so in the container's
// status (an env variable) or only in FailedMount events (a volume).
func TestMissingSecretFailsTheAttempt(t *testing.T) {
	ctx := context.Background()
	failedMount := func(message string) []corev1.Event {
		return []corev1.Event{
			{Reason: "Scheduled", Message: "Successfully assigned ns/a0-1 to node-1"},
			{Type: corev1.EventTypeWarning, Reason: "FailedMount", Message: message},
		}
	}
	ready := corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue}
	notReady := corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse}
	tests := []struct {
		name        string
		secrets     []flytev1.TaskSecret
		pod         *corev1.Pod
		events      []corev1.Event // nil: reading them fails the test
		listErr     error
		wantPhase   core.Phase
		wantMessage string // part of the failure's message
		wantRecheck bool
	}{
		{name: "no Secret for an env variable", secrets: dbSecrets,
			pod:       onNode("CreateContainerConfigError", `secret "db" not found`),
			wantPhase: core.PhasePermanentFailure, wantMessage: `Secret "db" does not exist (spec.secrets[0], env DB_PASSWORD): CreateContainerConfigError: secret "db" not found`},
		{name: "no key for an env variable", secrets: dbSecrets,
			pod:       onNode("CreateContainerConfigError", "couldn't find key password in Secret ns/db"),
			wantPhase: core.PhasePermanentFailure, wantMessage: `Secret "db" key "password" does not exist (spec.secrets[0], env DB_PASSWORD)`},
		{name: "another config error waits", pod: onNode("CreateContainerConfigError", "failed to sync secret cache: timed out waiting for the condition"),
			wantPhase: core.PhaseInitializing},
		{name: "no Secret for a volume", secrets: dbSecrets, pod: onNode("ContainerCreating", "", notReady),
			events:    failedMount(`MountVolume.SetUp failed for volume "flyte-secret-1" : secret "tls" not found`),
			wantPhase: core.PhasePermanentFailure, wantMessage: `pod a0-1 cannot start: Secret "tls" does not exist (spec.secrets[1], mountPath /etc/tls): FailedMount: MountVolume.SetUp`},
		{name: "no key for a volume", secrets: []flytev1.TaskSecret{{Name: "db", Key: "password", MountPath: "/etc/db"}}, pod: onNode("ContainerCreating", ""),
			events:    failedMount(`MountVolume.SetUp failed for volume "flyte-secret-0" : references non-existent secret key: password`),
			wantPhase: core.PhasePermanentFailure, wantMessage: `Secret "db" key "password" does not exist (spec.secrets[0], mountPath /etc/db)`},
		{name: "mounting, nothing wrong yet", secrets: dbSecrets, pod: onNode("ContainerCreating", ""),
			events: failedMount(`MountVolume.SetUp failed for volume "kube-api-access" : object "ns"/"kube-root-ca.crt" not registered`), wantPhase: core.PhaseInitializing, wantRecheck: true},
		{name: "events unreadable", secrets: dbSecrets, pod: onNode("ContainerCreating", ""), listErr: errors.New("throttled"),
			wantPhase: core.PhaseInitializing, wantRecheck: true},
		{name: "volumes mounted: events not read", secrets: dbSecrets, pod: onNode("ContainerCreating", "", ready), wantPhase: core.PhaseInitializing},
		{name: "no Secret volumes: events not read", secrets: dbSecrets[:1], pod: onNode("ContainerCreating", ""), wantPhase: core.PhaseInitializing},
		{name: "not on a node: events not read", secrets: dbSecrets,
			pod: &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}, wantPhase: core.PhaseQueued},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := &flytev1.TaskAction{Spec: flytev1.TaskActionSpec{ActionName: "a0", RunOutputBase: "mem://out/r1", Secrets: tt.secrets}}
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: ta, Attempt: 1, DataStore: datastore.New(),
				Clock: func() time.Time { return now }})
			p := container.New(k8s.Config{ImagePullGracePeriod: metav1.Duration{Duration: time.Minute}}, nil)
			info, err := p.GetTaskPhase(ctx, tCtx, tt.pod)
			if err != nil {
				t.Fatal(err)
			}
			info, err = p.PhaseFromEvents(ctx, tCtx, tt.pod, info, func() ([]corev1.Event, error) {
				if tt.events == nil && tt.listErr == nil {
					t.Fatal("the events were read")
				}
				return tt.events, tt.listErr
			})
			if err != nil {
				t.Fatal(err)
			}
			if info.Phase != tt.wantPhase {
				t.Fatalf("phase %s (%s: %s); want %s", info.Phase, info.Reason, info.Message, tt.wantPhase)
			}
			if tt.wantMessage != "" && (info.Err == nil || info.Err.Code != flytek8s.CodeMissingSecret || info.Err.Kind != core.ErrorKindUser ||
				!strings.Contains(info.Err.Message, tt.wantMessage)) {
				t.Fatalf("error %+v; want a user error %s containing %q", info.Err, flytek8s.CodeMissingSecret, tt.wantMessage)
			}
			if recheck := info.RequeueAfter > 0; recheck != tt.wantRecheck {
				t.Fatalf("requeue after %s; want a recheck: %v", info.RequeueAfter, tt.wantRecheck)
			}
		})
	}
}

func TestMissingSecretAfterGrace(t *testing.T) {
	created := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	failed := core.PhaseInfoPermanentFailure(core.ErrorKindUser, flytek8s.CodeMissingSecret, `Secret "db" does not exist`)
	tests := []struct {
		name        string
		age, grace  time.Duration
		wantPhase   core.Phase
		wantRequeue time.Duration
	}{
		{"no grace: fails at once", 0, 0, core.PhasePermanentFailure, 0},
		{"within the grace: waits for its end", 5 * time.Second, 8 * time.Second, core.PhaseInitializing, 3 * time.Second},
		{"a long grace: looks again at the recheck", time.Second, time.Minute, core.PhaseInitializing, flytek8s.SecretMountRecheck},
		{"the grace over: fails", 30 * time.Second, 30 * time.Second, core.PhasePermanentFailure, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := flytek8s.MissingSecretAfterGrace(failed, created, created.Add(tt.age), tt.grace)
			if got.Phase != tt.wantPhase || got.RequeueAfter != tt.wantRequeue {
				t.Fatalf("phase %v, requeue %s; want %v, %s", got.Phase, got.RequeueAfter, tt.wantPhase, tt.wantRequeue)
			}
			if got.Message != failed.Message {
				t.Errorf("message %q; want the failure's %q", got.Message, failed.Message)
			}
			if got.Phase == core.PhaseInitializing && got.Reason != flytek8s.ReasonWaitingForSecret {
				t.Errorf("reason %q; want %s", got.Reason, flytek8s.ReasonWaitingForSecret)
			}
		})
	}
}
