package flytek8s_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// TestClassifyExit: how the task's container ended decides whose failure it is and its
// code, the same for every plugin that runs it.
func TestClassifyExit(t *testing.T) {
	preempted := flytek8s.Disruption{Reason: "Preempted", Message: "preempted by a pod of higher priority"}
	evicted := flytek8s.Disruption{Reason: "Evicted", Message: "the node was low on memory"}
	shutdown := flytek8s.Disruption{Reason: "Terminated", Message: "Pod was terminated in response to imminent node shutdown."}
	deleted := flytek8s.Disruption{Reason: "Terminating", Message: "pod a-1 is being deleted"}
	exited := func(code int32, reason string) corev1.ContainerStateTerminated {
		return corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}
	}
	user, system := core.ErrorKindUser, core.ErrorKindSystem
	tests := []struct {
		name       string
		terminated corev1.ContainerStateTerminated
		disruption flytek8s.Disruption
		wantKind   core.ErrorKind
		wantCode   string
		wantIn     []string // in the message
	}{
		{name: "exit 1", terminated: exited(1, "Error"), wantKind: user, wantCode: "ExitCode1", wantIn: []string{"container task exited with 1 (Error)"}},
		{name: "exit 3 with the runtime's message", terminated: corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error", Message: "x must be positive"},
			wantKind: user, wantCode: "ExitCode3", wantIn: []string{"exited with 3", "x must be positive"}},
		{name: "exit 125", terminated: exited(125, "Error"), wantKind: user, wantCode: "ExitCode125"},
		{name: "exit 126: not executable", terminated: exited(126, "Error"), wantKind: user, wantCode: "ExitCode126",
			wantIn: []string{"exited with 126", "not executable", "permission denied"}},
		{name: "exit 127: command not found", terminated: exited(127, "Error"), wantKind: user, wantCode: "ExitCode127",
			wantIn: []string{"exited with 127", "command not found", "PATH", "spec.container.command"}},
		{name: "exit 128: the runtime could not start it", terminated: corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError",
			Message: `exec: "nope": executable file not found in $PATH`}, wantKind: user, wantCode: "ExitCode128",
			wantIn: []string{"could not start", `exec: "nope": executable file not found in $PATH`}},
		{name: "SIGKILL without a disruption", terminated: exited(137, "Error"), wantKind: user, wantCode: "KilledBySIGKILL",
			wantIn: []string{"SIGKILL", "signal 9", "exit code 137"}},
		{name: "SIGTERM without a disruption", terminated: exited(143, "Error"), wantKind: user, wantCode: "KilledBySIGTERM",
			wantIn: []string{"SIGTERM", "signal 15", "exit code 143"}},
		{name: "SIGINT", terminated: exited(130, "Error"), wantKind: user, wantCode: "KilledBySIGINT", wantIn: []string{"signal 2"}},
		{name: "SIGABRT", terminated: exited(134, "Error"), wantKind: user, wantCode: "KilledBySIGABRT", wantIn: []string{"signal 6", "aborted"}},
		{name: "SIGSEGV", terminated: exited(139, "Error"), wantKind: user, wantCode: "KilledBySIGSEGV", wantIn: []string{"signal 11", "segmentation fault"}},
		{name: "a real-time signal has no name", terminated: exited(128+40, "Error"), wantKind: user, wantCode: "KilledBySignal40",
			wantIn: []string{"signal 40", "exit code 168"}},
		{name: "the runtime's signal wins over the exit code", terminated: corev1.ContainerStateTerminated{ExitCode: 1, Signal: 9, Reason: "Error"},
			wantKind: user, wantCode: "KilledBySIGKILL", wantIn: []string{"signal 9"}},
		{name: "above the signals: an exit code", terminated: exited(200, "Error"), wantKind: user, wantCode: "ExitCode200"},
		{name: "exit 255", terminated: exited(255, "Error"), wantKind: user, wantCode: "ExitCode255"},
		{name: "a negative exit code", terminated: exited(-1, "Error"), wantKind: user, wantCode: "ExitCode-1"},
		{name: "out of memory", terminated: exited(137, "OOMKilled"), wantKind: user, wantCode: "OOMKilled",
			wantIn: []string{"OOMKilled", "memory limit"}},
		{name: "out of memory while being preempted is still the task's", terminated: exited(137, "OOMKilled"), disruption: preempted,
			wantKind: user, wantCode: "OOMKilled"},
		{name: "SIGTERM of a preemption", terminated: exited(143, "Error"), disruption: preempted, wantKind: system, wantCode: "Preempted",
			wantIn: []string{"preempted by a pod of higher priority", "SIGTERM", "143"}},
		{name: "SIGKILL of an eviction", terminated: exited(137, "Error"), disruption: evicted, wantKind: system, wantCode: "Evicted",
			wantIn: []string{"the node was low on memory", "SIGKILL"}},
		{name: "SIGTERM of a node shutdown", terminated: exited(143, "Error"), disruption: shutdown, wantKind: system, wantCode: "Terminated"},
		{name: "SIGTERM of a deletion", terminated: exited(143, "Error"), disruption: deleted, wantKind: system, wantCode: "Terminating"},
		{name: "a task that answers SIGTERM with its own code", terminated: exited(1, "Error"), disruption: preempted, wantKind: system,
			wantCode: "Preempted", wantIn: []string{"exited with 1"}},
		{name: "exit 0 of a disrupted pod", terminated: exited(0, "Completed"), disruption: evicted, wantKind: system, wantCode: "Evicted"},
		{name: "exit 0, yet the pod failed", terminated: exited(0, "Completed"), wantKind: system, wantCode: "PodFailed",
			wantIn: []string{"exited with 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := flytek8s.ClassifyExit(tt.terminated, tt.disruption)
			if got.Kind != tt.wantKind || got.Code != tt.wantCode {
				t.Fatalf("got %s of kind %d (%q); want %s of kind %d", got.Code, got.Kind, got.Message, tt.wantCode, tt.wantKind)
			}
			for _, w := range tt.wantIn {
				if !strings.Contains(got.Message, w) {
					t.Errorf("message %q; want %q in it", got.Message, w)
				}
			}
		})
	}
}
