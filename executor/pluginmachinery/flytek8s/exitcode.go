package flytek8s

import (
	"cmp"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// Disruption is what, other than the task, stopped its pod: a preemption, an eviction, a
// node shutdown or a deletion. Its Reason ("Preempted", "Evicted", "Terminated",
// "Terminating", …) becomes the code of the system failure; the zero Disruption means
// nothing did.
type Disruption struct{ Reason, Message string }

// Codes of ClassifyExit that are not ExitCode<N> or KilledBy<signal>.
const (
	CodeOOMKilled = "OOMKilled"
	CodePodFailed = "PodFailed"
)

// ClassifyExit says whose failure the end of an attempt is, and names it, from how the
// task's container terminated and whether something stopped its pod. The container and
// k8s-job plugins both use it, so that the same ending is the same failure whichever ran
// the task.
//
//   - OOMKilled: the user's, code OOMKilled, even when the pod was also being stopped:
//     the kernel killed the task for its memory use, not for the disruption.
//   - A disrupted pod: a system failure under the disruption's reason, whatever the code.
//     The disruption sent SIGTERM, then SIGKILL; the task may answer with any code.
//   - Exit 1 to 125, and 193 to 255: the user's, code ExitCode<N>. 126 and 127 say what
//     the shell means by them; 128 with the runtime's StartError says it could not start.
//   - 128+N for a signal N (1 to 64), or the signal the runtime reports: the user's, code
//     KilledBy<name> (KilledBySignal<N> for a signal without one). Nothing outside the
//     pod stopped it, so the task or its container killed itself.
//   - Exit 0 of a failed pod (another container, or the pod itself, failed): a system
//     failure, PodFailed, since the task's own work ended well.
func ClassifyExit(t corev1.ContainerStateTerminated, d Disruption) core.ExecutionError {
	exit := fmt.Sprintf("container %s exited with %d (%s)", ContainerName, t.ExitCode, t.Reason)
	signal := signalOf(t)
	switch {
	case t.Reason == "OOMKilled":
		return userError(CodeOOMKilled, exit+": it went over its memory limit (spec.container.resources.limits.memory)", t.Message)
	case d.Reason != "":
		how := exit
		if signal != 0 {
			how = fmt.Sprintf("container %s stopped by %s, exit code %d", ContainerName, signalName(signal), t.ExitCode)
		}
		return core.ExecutionError{Kind: core.ErrorKindSystem, Code: d.Reason, Message: fmt.Sprintf("%s (%s)", cmp.Or(d.Message, d.Reason), how)}
	case signal != 0:
		what := signalName(signal)
		if desc := signalDescriptions[signal]; desc != "" {
			what += ", " + desc
		}
		code := "KilledBy" + signalName(signal)
		if signalNames[signal] == "" {
			code = "KilledBySignal" + strconv.Itoa(int(signal))
		}
		return userError(code, fmt.Sprintf("container %s was killed by signal %d (%s), exit code %d (%s)",
			ContainerName, signal, what, t.ExitCode, t.Reason), t.Message)
	case t.ExitCode == 0:
		return core.ExecutionError{Kind: core.ErrorKindSystem, Code: CodePodFailed, Message: exit + ", yet its pod failed"}
	}
	code := "ExitCode" + strconv.Itoa(int(t.ExitCode))
	switch {
	case t.Reason == "StartError" || t.Reason == "ContainerCannotRun":
		exit += ": the container could not start"
	case t.ExitCode == 126:
		exit += ": the command was found but could not run: not executable, or permission denied"
	case t.ExitCode == 127:
		exit += ": command not found: check the image's PATH and spec.container.command"
	}
	return userError(code, exit, t.Message)
}

func userError(code, message, detail string) core.ExecutionError {
	if detail != "" {
		message += ": " + detail
	}
	return core.ExecutionError{Kind: core.ErrorKindUser, Code: code, Message: message}
}

// maxSignal is the highest Linux signal number (SIGRTMAX).
const maxSignal = 64

// signalOf is the signal that ended the container, 0 for none: the one the runtime
// reports, or N of an exit code 128+N, the shell's and the runtimes' convention.
func signalOf(t corev1.ContainerStateTerminated) int32 {
	if t.Signal > 0 && t.Signal <= maxSignal {
		return t.Signal
	}
	if n := t.ExitCode - 128; n >= 1 && n <= maxSignal {
		return n
	}
	return 0
}

func signalName(n int32) string {
	if name := signalNames[n]; name != "" {
		return name
	}
	return "signal " + strconv.Itoa(int(n))
}

// signalNames are Linux's signal numbers as on amd64, arm64, ppc64le and s390x. They are
// the container's, whatever system the executor runs on, so they are written out rather
// than taken from the executor's own (golang.org/x/sys/unix.SignalName agrees on Linux;
// a test checks it). The real-time signals, 32 to 64, have no fixed names.
var signalNames = map[int32]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
	9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
	16: "SIGSTKFLT", 17: "SIGCHLD", 18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP", 21: "SIGTTIN", 22: "SIGTTOU",
	23: "SIGURG", 24: "SIGXCPU", 25: "SIGXFSZ", 26: "SIGVTALRM", 27: "SIGPROF", 28: "SIGWINCH", 29: "SIGIO",
	30: "SIGPWR", 31: "SIGSYS",
}

// signalDescriptions say what the signals that end programs most often mean.
var signalDescriptions = map[int32]string{
	4: "illegal instruction", 6: "aborted", 7: "bus error", 8: "arithmetic error", 11: "segmentation fault",
	13: "broken pipe", 24: "CPU time limit exceeded", 25: "file size limit exceeded", 31: "bad system call",
}

// FailureOf is the failure of a pod that ended in PodFailed: how its task container
// ended (ClassifyExit), or, when it has no terminated status (the pod failed before the
// container ran), a system failure under what stopped the pod or the pod's own reason.
func FailureOf(pod *corev1.Pod) core.PhaseInfo {
	var d Disruption
	if reason, message, ok := disrupted(pod); ok {
		d = Disruption{Reason: reason, Message: message}
	}
	var e core.ExecutionError
	if t := terminatedTask(pod); t != nil {
		e = ClassifyExit(*t, d)
	} else {
		e = core.ExecutionError{Kind: core.ErrorKindSystem, Code: CodePodFailed, Message: fmt.Sprintf("pod %s failed", pod.Name)}
		if d.Reason != "" {
			e.Code, e.Message = d.Reason, cmp.Or(d.Message, d.Reason)
		}
	}
	if e.Code == CodePodFailed {
		// The pod's own reason (DeadlineExceeded, …) says more than PodFailed.
		e.Code = cmp.Or(pod.Status.Reason, CodePodFailed)
		if pod.Status.Message != "" {
			e.Message += ": " + pod.Status.Message
		}
	}
	if e.Kind == core.ErrorKindUser {
		return core.PhaseInfoUserFailure(e.Code, e.Message)
	}
	return core.PhaseInfoSystemFailure(e.Code, e.Message)
}

// terminatedTask is the terminated state of the pod's task container, nil if it has none.
func terminatedTask(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Terminated != nil {
			return cs.State.Terminated
		}
	}
	return nil
}
