package core

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Phase is where a plugin's execution of one attempt is. The reconciler maps it to the
// action's phase, and decides on retries from the failure phases.
type Phase int

// The phases, in order of progress.
const (
	// PhaseUndefined is never returned by a correct plugin.
	PhaseUndefined Phase = iota
	// PhaseNotReady: the plugin cannot start yet (a dependency is not ready); ask again later.
	PhaseNotReady
	// PhaseWaitingForResources: held back by quota or a shared resource's limit.
	PhaseWaitingForResources
	// PhaseQueued: accepted by the plugin, nothing started.
	PhaseQueued
	// PhaseInitializing: the workload exists and is starting.
	PhaseInitializing
	// PhaseRunning: the workload runs.
	PhaseRunning
	// PhaseSuccess: the attempt succeeded.
	PhaseSuccess
	// PhaseRetryableFailure: the attempt failed; the action may be retried (a user error
	// spends the action's retries, a system error the system-failure budget).
	PhaseRetryableFailure
	// PhasePermanentFailure: the attempt failed and retrying cannot help.
	PhasePermanentFailure
)

var phaseNames = [...]string{"Undefined", "NotReady", "WaitingForResources", "Queued", "Initializing", "Running",
	"Success", "RetryableFailure", "PermanentFailure"}

func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return fmt.Sprintf("Phase(%d)", int(p))
	}
	return phaseNames[p]
}

// IsTerminal reports whether the attempt is over.
func (p Phase) IsTerminal() bool {
	return p == PhaseSuccess || p == PhaseRetryableFailure || p == PhasePermanentFailure
}

// IsFailure reports whether the attempt failed.
func (p Phase) IsFailure() bool { return p == PhaseRetryableFailure || p == PhasePermanentFailure }

// ErrorKind says whose fault a failure is.
type ErrorKind int

// The error kinds.
const (
	// ErrorKindUser: the task's code or inputs; spends the action's retries.
	ErrorKindUser ErrorKind = iota + 1
	// ErrorKindSystem: the platform; spends the separate system-failure budget.
	ErrorKindSystem
)

// ExecutionError describes a failed attempt.
type ExecutionError struct {
	// Code is a short machine-readable cause, such as "OOMKilled".
	Code string
	// Kind says whose fault it is.
	Kind ErrorKind
	// Message explains it to a person.
	Message string
}

// PhaseInfo is what a plugin reports about an attempt.
type PhaseInfo struct {
	Phase Phase
	// Version orders changes within one phase (a new reason, new cluster events): a
	// change of version is reported even when the phase stays the same.
	Version uint32
	// Reason is a short CamelCase cause, such as "ImagePullBackOff".
	Reason string
	// Message explains the phase.
	Message string
	// Err is set for the failure phases.
	Err *ExecutionError
	// RequeueAfter asks to be called again after this long even if nothing changes,
	// so that timed work (a sleep, polling an external system) never blocks a worker.
	RequeueAfter time.Duration
	// OutputsURI is where the outputs were written, on success.
	OutputsURI string
	// LogLinks point at the attempt's logs.
	LogLinks []LogLink
	// ClusterEvents are Kubernetes events about the attempt's objects seen since the
	// previous report.
	ClusterEvents []ClusterEvent
}

// ClusterEvent is a Kubernetes event about one of an attempt's objects. Source is the
// component that reported it, such as "kubelet".
type ClusterEvent struct {
	OccurredAt                            time.Time
	Object, Type, Reason, Message, Source string
	Count                                 int32
}

// LogLink points at logs of an attempt.
type LogLink struct {
	Name, URI string
}

// IsAbsoluteURI reports whether s is an absolute URI (scheme and all, no spaces), the
// only kind of log link the events service accepts.
func IsAbsoluteURI(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.IsAbs() && !strings.ContainsAny(s, " \t\n")
}

// Transition is the result of Handle.
type Transition struct {
	Info PhaseInfo
}

// DoTransition wraps a PhaseInfo.
func DoTransition(info PhaseInfo) Transition { return Transition{Info: info} }

// PhaseInfoQueued reports an accepted attempt.
func PhaseInfoQueued(reason string) PhaseInfo { return PhaseInfo{Phase: PhaseQueued, Reason: reason} }

// PhaseInfoWaitingForResources reports an attempt held back, with why.
func PhaseInfoWaitingForResources(version uint32, reason, message string) PhaseInfo {
	return PhaseInfo{Phase: PhaseWaitingForResources, Version: version, Reason: reason, Message: message}
}

// PhaseInfoInitializing reports a starting workload.
func PhaseInfoInitializing(version uint32, reason, message string) PhaseInfo {
	return PhaseInfo{Phase: PhaseInitializing, Version: version, Reason: reason, Message: message}
}

// PhaseInfoRunning reports a running workload.
func PhaseInfoRunning(version uint32, reason string) PhaseInfo {
	return PhaseInfo{Phase: PhaseRunning, Version: version, Reason: reason}
}

// PhaseInfoSuccess reports success, with where the outputs are.
func PhaseInfoSuccess(outputsURI string) PhaseInfo {
	return PhaseInfo{Phase: PhaseSuccess, OutputsURI: outputsURI}
}

// PhaseInfoUserFailure reports a retryable failure of the task itself.
func PhaseInfoUserFailure(code, message string) PhaseInfo {
	return PhaseInfo{Phase: PhaseRetryableFailure, Reason: code, Message: message,
		Err: &ExecutionError{Code: code, Kind: ErrorKindUser, Message: message}}
}

// PhaseInfoSystemFailure reports a retryable failure of the platform.
func PhaseInfoSystemFailure(code, message string) PhaseInfo {
	return PhaseInfo{Phase: PhaseRetryableFailure, Reason: code, Message: message,
		Err: &ExecutionError{Code: code, Kind: ErrorKindSystem, Message: message}}
}

// PhaseInfoPermanentFailure reports a failure that retrying cannot fix.
func PhaseInfoPermanentFailure(kind ErrorKind, code, message string) PhaseInfo {
	return PhaseInfo{Phase: PhasePermanentFailure, Reason: code, Message: message,
		Err: &ExecutionError{Code: code, Kind: kind, Message: message}}
}
