package flytek8s

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/internal/textbound"
)

// CodeDeviceFault is the code of an attempt that failed on a node whose device reported
// a fault (k8s.DeviceFaultConfig): a system failure.
const CodeDeviceFault = "DeviceFault"

// ReasonWaitingForDeviceFaults is the reason of a failed attempt whose pod requested a
// device while it waits (k8s.DeviceFaultConfig.LateEventWait) for a report of a fault.
const ReasonWaitingForDeviceFaults = "WaitingForDeviceFaults"

// Bounds on what of an event is read: every byte of it is written by whoever may create
// events in the namespace, or by the node.
const (
	// maxScannedMessage is how much of an event's message the patterns see.
	maxScannedMessage = 4096
	// maxScannedEvents is how many of a pod's events, the newest, are looked at.
	maxScannedEvents = 256
	// maxFaultMessage bounds the event's message quoted in the failure.
	maxFaultMessage = 512
	// maxFaultField bounds the event's reason, source and the fault's code there.
	maxFaultField = 128
)

// DeviceFault is a device fault an event reported.
type DeviceFault struct {
	// Pattern is the name of the pattern that matched; Code the fault's code (the Xid),
	// if the pattern names one.
	Pattern, Code string
	// Reason, Message and Source are the event's, made valid UTF-8 and bounded.
	Reason, Message, Source string
	At                      time.Time
}

// FindDeviceFault returns the newest Warning event of events (oldest first) that a rule
// matches. It looks at the newest maxScannedEvents only, and at the start of each.
func FindDeviceFault(rules []k8s.DeviceFaultRule, events []corev1.Event) (DeviceFault, bool) {
	if len(rules) == 0 {
		return DeviceFault{}, false
	}
	scanned := 0
	for i := len(events) - 1; i >= 0 && scanned < maxScannedEvents; i-- {
		e := &events[i]
		if e.Type != corev1.EventTypeWarning {
			continue
		}
		scanned++
		reason := textbound.Fit(e.Reason, maxFaultField)
		message := textbound.Fit(e.Message, maxScannedMessage)
		source := textbound.Fit(cmp.Or(e.Source.Component, e.ReportingController), maxFaultField)
		for _, r := range rules {
			code, ok := matchesRule(r, reason, message, source)
			if !ok {
				continue
			}
			return DeviceFault{Pattern: r.Name, Code: textbound.Fit(code, maxFaultField), Reason: reason,
				Message: textbound.Fit(message, maxFaultMessage), Source: source, At: eventAt(e)}, true
		}
	}
	return DeviceFault{}, false
}

// matchesRule reports whether r matches an event, and the fault's code: the first one the
// message names that r does not ignore.
func matchesRule(r k8s.DeviceFaultRule, reason, message, source string) (string, bool) {
	if r.Reason != nil && !r.Reason.MatchString(reason) || r.Source != nil && !r.Source.MatchString(source) {
		return "", false
	}
	if r.Message == nil {
		return "", true
	}
	group := r.Message.SubexpIndex("code")
	if group < 0 {
		return "", r.Message.MatchString(message)
	}
	// Bounded by the message's length: each match consumes some of it.
	for _, m := range r.Message.FindAllStringSubmatch(message, -1) {
		if !slices.Contains(r.IgnoreCodes, m[group]) {
			return m[group], true
		}
	}
	return "", false
}

func eventAt(e *corev1.Event) time.Time {
	for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return e.CreationTimestamp.Time
}

// SystemFailureOf makes failed, a user's failure of an attempt, the device fault's: a
// system failure that says what the node reported, and what the task's end looked like.
func (f DeviceFault) SystemFailureOf(pod *corev1.Pod, failed core.PhaseInfo) core.PhaseInfo {
	what := f.Pattern
	if f.Code != "" {
		what += " " + f.Code
	}
	node := ""
	if pod.Spec.NodeName != "" {
		node = " on node " + pod.Spec.NodeName
	}
	prior := failed.Message
	if failed.Err != nil {
		prior = failed.Err.Code + ": " + failed.Err.Message
	}
	message := fmt.Sprintf("device fault (%s) reported%s for pod %s by %s: %s: %s; not charged to the task (%s)",
		what, node, pod.Name, cmp.Or(f.Source, "unknown"), f.Reason, f.Message, prior)
	info := core.PhaseInfoSystemFailure(CodeDeviceFault, message)
	info.Version = failed.Version
	return info
}

// requestsDevice reports whether a container of pod requests an extended resource whose
// name has one of prefixes.
func requestsDevice(pod *corev1.Pod, prefixes []string) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
				for name := range list {
					for _, p := range prefixes {
						if p != "" && strings.HasPrefix(string(name), p) {
							return true
						}
					}
				}
			}
		}
	}
	return false
}

// stoppedAt is when the pod's task container stopped, zero if it does not say.
func stoppedAt(pod *corev1.Pod) time.Time {
	if t := terminatedTask(pod); t != nil {
		return t.FinishedAt.Time
	}
	return time.Time{}
}

// deviceFaultOf makes info, the user's failure of a failed pod, a system failure when an
// event about the pod reports a fault of the node's devices (k8s.Config.DeviceFaults). A
// pod that requested a device and stopped less than LateEventWait ago waits for the
// report, Running, before its failure is charged to the user. Only a failed attempt's
// events are read: a running or succeeding one costs nothing more.
func (p TaskPods) deviceFaultOf(_ context.Context, tCtx core.TaskExecutionContext, pod *corev1.Pod, info core.PhaseInfo,
	events func() ([]corev1.Event, error)) (core.PhaseInfo, error) {
	list, err := events()
	if err != nil {
		// Charging the user could be wrong, and the failure stays: read again later.
		return core.PhaseInfo{}, err
	}
	if f, ok := FindDeviceFault(p.Config.DeviceFaultRules, list); ok {
		return f.SystemFailureOf(pod, info), nil
	}
	cfg := p.Config.DeviceFaults
	stopped := stoppedAt(pod)
	if cfg.LateEventWait.Duration <= 0 || stopped.IsZero() || !requestsDevice(pod, cfg.DeviceResourcePrefixes) {
		return info, nil
	}
	left := cfg.LateEventWait.Duration - tCtx.Metadata().Now().Sub(stopped)
	if left <= 0 {
		return info, nil
	}
	wait := core.PhaseInfoRunning(1, ReasonWaitingForDeviceFaults)
	wait.Message = fmt.Sprintf("container %s of pod %s stopped; waiting up to %s for the node to report a fault of its devices before the failure is the task's",
		ContainerName, pod.Name, cfg.LateEventWait.Duration)
	wait.RequeueAfter = left
	return wait, nil
}

// usersFailureOfPod reports whether info is the user's retryable failure of a pod that
// failed: the failure a device fault reclassifies.
func usersFailureOfPod(pod *corev1.Pod, info core.PhaseInfo) bool {
	return pod.Status.Phase == corev1.PodFailed && info.Phase == core.PhaseRetryableFailure &&
		info.Err != nil && info.Err.Kind == core.ErrorKindUser
}
