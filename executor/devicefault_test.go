package executor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/test/eventually"
)

// xidMessage is a kernel line of the NVIDIA driver, as a node agent forwards it.
const xidMessage = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."

// nodeEvent records a Warning event about pod from a node's agent.
func nodeEvent(t *testing.T, pod *corev1.Pod, reason, message string) {
	t.Helper()
	now := metav1.Now()
	event := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod.Name, time.Now().UnixNano()), Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Type:           corev1.EventTypeWarning, Reason: reason, Message: message,
		Source: corev1.EventSource{Component: "gpu-health", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := env.Client.Create(context.Background(), event); err != nil {
		t.Fatal(err)
	}
}

// exited is a task container's end with code.
func exited(code int32) *corev1.ContainerStateTerminated {
	now := metav1.Now()
	return &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", StartedAt: now, FinishedAt: now}
}

// waitRetried waits for the action to start its second attempt and returns it.
func waitRetried(t *testing.T, key client.ObjectKey) *flytev1.TaskAction {
	t.Helper()
	var ta flytev1.TaskAction
	eventually.True(t, time.Minute, func() bool {
		return env.Client.Get(context.Background(), key, &ta) == nil && ta.Status.Attempts == 2
	}, func() string { return fmt.Sprintf("%s was not retried; status %+v", key, ta.Status) })
	return &ta
}

// failedEntry is the history entry that closed the first attempt.
func failedEntry(t *testing.T, ta *flytev1.TaskAction) flytev1.PhaseTransition {
	t.Helper()
	for _, h := range ta.Status.PhaseHistory {
		if h.Attempt == 1 && h.Reason == flytev1.ReasonAttemptFailed {
			return h
		}
	}
	t.Fatalf("no AttemptFailed entry in %+v", ta.Status.PhaseHistory)
	return flytev1.PhaseTransition{}
}

// checkDeviceFault checks that the first attempt failed as the platform's, with the event.
func checkDeviceFault(t *testing.T, ta *flytev1.TaskAction, message string) {
	t.Helper()
	if ta.Status.UserFailures != 0 || ta.Status.SystemFailures != 1 {
		t.Fatalf("user failures %d, system failures %d; want 0 and 1", ta.Status.UserFailures, ta.Status.SystemFailures)
	}
	h := failedEntry(t, ta)
	if h.Error == nil || h.Error.Kind != flytev1.ErrorKindSystem || h.Error.Code != flytek8s.CodeDeviceFault ||
		!strings.Contains(h.Error.Message, message) || !strings.Contains(h.Error.Message, "ExitCode1") {
		t.Fatalf("the failed attempt's error is %+v; want a system DeviceFault quoting %q and the exit", h.Error, message)
	}
	var reported bool
	for _, e := range h.ClusterEvents {
		reported = reported || e.Type == corev1.EventTypeWarning && e.Message == message && e.Source == "gpu-health"
	}
	if !reported {
		t.Fatalf("the failed attempt's entry carries events %+v; want the fault's", h.ClusterEvents)
	}
}

// TestDeviceFaultIsTheSystemsFailure: a container that exits with 1 on a node whose GPU
// reported an Xid about its pod failed because of the hardware: the attempt is retried
// on the system budget, the user's retries untouched, and its history shows the event.
// An Xid the application causes (31) does not change whose failure it is.
func TestDeviceFaultIsTheSystemsFailure(t *testing.T) {
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.K8s.DeviceFaults.LateEventWait = metav1.Duration{} // tested below
	run(t, cfg, ns, nil)

	hw, app := containerAction(ns, "xid", 1), containerAction(ns, "xid31", 1)
	createActions(t, 2, func(i int) *flytev1.TaskAction { return []*flytev1.TaskAction{hw, app}[i] })
	for _, c := range []struct {
		ta      *flytev1.TaskAction
		message string
	}{{hw, xidMessage}, {app, "NVRM: Xid (PCI:0000:3b:00): 31, pid=4242, name=python3, Ch 00000008, intr 10000000. MMU Fault"}} {
		pod := bindAndRun(t, c.ta, c.ta.Name+"-1")
		nodeEvent(t, pod, "NvidiaXid", c.message)
		kubelet(t, pod, corev1.PodFailed, exited(1))
	}

	checkDeviceFault(t, waitRetried(t, client.ObjectKeyFromObject(hw)), xidMessage)
	got := waitRetried(t, client.ObjectKeyFromObject(app))
	if got.Status.UserFailures != 1 || got.Status.SystemFailures != 0 {
		t.Fatalf("Xid 31: user failures %d, system failures %d; want 1 and 0", got.Status.UserFailures, got.Status.SystemFailures)
	}
	if h := failedEntry(t, got); h.Error == nil || h.Error.Kind != flytev1.ErrorKindUser || h.Error.Code != "ExitCode1" {
		t.Fatalf("Xid 31: the failed attempt's error is %+v; want the user's ExitCode1", h.Error)
	}
}

// TestDeviceFaultReportedLate: the node's agent may report the fault after the container
// died of it. A failed pod that requested a GPU waits k8s.deviceFaults.lateEventWait for
// the report before its failure is the user's; a pod that succeeded stays a success
// whatever its node reports.
func TestDeviceFaultReportedLate(t *testing.T) {
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.K8s.DeviceFaults.LateEventWait = metav1.Duration{Duration: 20 * time.Second}
	run(t, cfg, ns, nil)

	gpu := func(name string) *flytev1.TaskAction {
		ta := containerAction(ns, name, 1)
		one := resource.MustParse("1")
		ta.Spec.Container.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{"nvidia.com/gpu": one}, Limits: corev1.ResourceList{"nvidia.com/gpu": one}}
		return ta
	}
	late, none, ok := gpu("late"), gpu("none"), gpu("ok")
	createActions(t, 3, func(i int) *flytev1.TaskAction { return []*flytev1.TaskAction{late, none, ok}[i] })
	pods := map[string]*corev1.Pod{}
	for _, ta := range []*flytev1.TaskAction{late, none, ok} {
		pods[ta.Name] = bindAndRun(t, ta, ta.Name+"-1")
	}
	kubelet(t, pods["late"], corev1.PodFailed, exited(1))
	kubelet(t, pods["none"], corev1.PodFailed, exited(1))
	nodeEvent(t, pods["ok"], "NvidiaXid", xidMessage)
	kubelet(t, pods["ok"], corev1.PodSucceeded, exited(0))

	// The failure waits for the report: only then does the node's agent write it.
	var got flytev1.TaskAction
	eventually.True(t, 30*time.Second, func() bool {
		if env.Client.Get(context.Background(), client.ObjectKeyFromObject(late), &got) != nil {
			return false
		}
		last, _ := got.Status.PhaseHistory.Last()
		return last.Reason == flytek8s.ReasonWaitingForDeviceFaults
	}, func() string { return fmt.Sprintf("the failed attempt does not wait; status %+v", got.Status) })
	if got.Status.Attempts != 1 || got.Status.UserFailures != 0 {
		t.Fatalf("while it waits: attempts %d, user failures %d; want 1 and 0", got.Status.Attempts, got.Status.UserFailures)
	}
	nodeEvent(t, pods["late"], "NvidiaXid", xidMessage)

	checkDeviceFault(t, waitRetried(t, client.ObjectKeyFromObject(late)), xidMessage)
	other := waitRetried(t, client.ObjectKeyFromObject(none))
	if other.Status.UserFailures != 1 || other.Status.SystemFailures != 0 {
		t.Fatalf("no report: user failures %d, system failures %d; want 1 and 0", other.Status.UserFailures, other.Status.SystemFailures)
	}
	if s := waitSucceeded(t, client.ObjectKeyFromObject(ok)); s.Status.SystemFailures != 0 || s.Status.Attempts != 1 {
		t.Fatalf("the pod that succeeded: attempts %d, system failures %d; want 1 and 0", s.Status.Attempts, s.Status.SystemFailures)
	}
}
