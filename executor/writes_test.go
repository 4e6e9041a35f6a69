package executor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// TestWritesPerAction counts every API write the executor makes for one action, from
// its create (the user's, not counted) until it is finished with its finalizer off: one
// for each thing someone learns from it, and no more.
func TestWritesPerAction(t *testing.T) {
	tests := []struct {
		name string
		// action is what the user creates; drive plays the node, if any.
		action func(ns string) *flytev1.TaskAction
		drive  func(t *testing.T, ta *flytev1.TaskAction)
		// taskActionWrites: the status writes and the finalizer's.
		taskActionWrites int
		// events: an events service runs, whose events the action keeps until delivered.
		events bool
		// admission: the API server puts the finalizer on at creation
		// (deploy/kustomize/components/finalizer-at-admission).
		admission bool
	}{
		{name: "core-sleep 0s without events: its outcome", taskActionWrites: 1, action: noop},
		{name: "core-sleep 0s: finalizer on, its outcome, finalizer off once delivered", taskActionWrites: 3, action: noop, events: true},
		{name: "core-sleep 0s, the finalizer put on at admission: its outcome, finalizer off", taskActionWrites: 2, action: noop, events: true, admission: true},
		{name: "container finished before it was scheduled: finalizer on, Queued, Succeeded, finalizer off", taskActionWrites: 4,
			action: func(ns string) *flytev1.TaskAction { return containerAction(ns, "quick", 0) },
			drive: func(t *testing.T, ta *flytev1.TaskAction) {
				kubelet(t, waitPod(t, ta.Namespace, "quick-1"), corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
			}},
		{name: "container finished before it was scheduled, the finalizer put on at admission: Queued, Succeeded, finalizer off", taskActionWrites: 3,
			action: func(ns string) *flytev1.TaskAction { return containerAction(ns, "quick", 0) }, events: true, admission: true,
			drive: func(t *testing.T, ta *flytev1.TaskAction) {
				kubelet(t, waitPod(t, ta.Namespace, "quick-1"), corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
			}},
		{name: "container seen in every phase: finalizer on, Queued, Initializing, Running, Succeeded, finalizer off", taskActionWrites: 6,
			action: func(ns string) *flytev1.TaskAction { return containerAction(ns, "slow", 0) },
			drive: func(t *testing.T, ta *flytev1.TaskAction) {
				pod := bind(t, waitPod(t, ta.Namespace, "slow-1"))
				waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseInitializing)
				kubelet(t, pod, corev1.PodRunning, nil)
				waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
				kubelet(t, waitPod(t, ta.Namespace, "slow-1"), corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			restConfig, rec := recordingConfig()
			cfg := testConfig()
			if tt.events {
				db := pgtest.New(t).NewDatabase(t)
				cfg.EventsServiceURL = servicetest.Run(t, events.Run, events.Config{Listen: "127.0.0.1:0", DatabaseURL: db, Auth: auth.Config{Mode: auth.ModeNone}}).URL
			}
			if tt.admission {
				remove, err := kubetest.FinalizerAtAdmission(context.Background(), env.Client, ns, controller.Finalizer)
				t.Cleanup(remove)
				if err != nil {
					t.Fatal(err)
				}
			}
			start(t, cfg, ns, runOptions{restConfig: restConfig})
			ta := tt.action(ns)
			if err := env.Client.Create(context.Background(), ta); err != nil {
				t.Fatal(err)
			}
			if tt.drive != nil {
				tt.drive(t, ta)
			}
			got := waitFinishedWithoutFinalizer(t, client.ObjectKeyFromObject(ta))
			if got.Status.Phase != flytev1.PhaseSucceeded {
				t.Fatalf("ended %s: %+v", got.Status.Phase, got.Status.Error)
			}
			time.Sleep(300 * time.Millisecond) // a write that should not come would come by now
			if w := rec.writes("taskactions"); w != tt.taskActionWrites {
				t.Errorf("%d TaskAction writes (%s); want %d", w, rec.writeKinds("taskactions"), tt.taskActionWrites)
			}
			if w := rec.writes("events"); w != 0 {
				t.Errorf("%d Kubernetes Event writes for an action that succeeded; want none", w)
			}
		})
	}
}

func noop(ns string) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: "noop", Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "writes", ActionName: "noop",
			TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/writes", Config: map[string]string{"duration": "0s"}},
	}
}

// waitFinishedWithoutFinalizer waits until the action is finished and its finalizer off.
func waitFinishedWithoutFinalizer(t *testing.T, key client.ObjectKey) *flytev1.TaskAction {
	t.Helper()
	var ta flytev1.TaskAction
	eventually.True(t, 30*time.Second, func() bool {
		return env.Client.Get(context.Background(), key, &ta) == nil && ta.Status.Phase.IsTerminal() && len(ta.Finalizers) == 0
	}, func() string {
		return fmt.Sprintf("%s never finished without its finalizer; status %+v, finalizers %v", key, ta.Status, ta.Finalizers)
	})
	return &ta
}
