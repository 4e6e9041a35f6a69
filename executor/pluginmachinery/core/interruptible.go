package core

import (
	"fmt"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// InterruptiblePolicy decides whether an attempt of an action with spec.interruptible
// still runs on preemptible capacity. Such capacity fails actions more often, by
// design; an action it keeps failing would spend its whole system budget there, so
// after enough system failures its attempts move to on-demand capacity.
type InterruptiblePolicy struct {
	// FailureThreshold is the executor's k8s.interruptibleFailureThreshold: a positive
	// N keeps attempts interruptible while the action has had fewer than N system
	// failures; a negative -N, fewer than MaxSystemFailures less N. 0: always.
	FailureThreshold int32
	// MaxSystemFailures is the executor's maxSystemFailures.
	MaxSystemFailures int32
}

// Decide says whether the attempt ta starts next (or runs now) is interruptible, from
// the system failures ta has had so far, which is the count that attempt sees: the
// failure that ended the previous one is counted before it starts. When an
// interruptible action runs on on-demand capacity because of the threshold, onDemand
// says why, for its history; otherwise it is empty.
func (p InterruptiblePolicy) Decide(ta *flytev1.TaskAction) (interruptible bool, onDemand string) {
	if !ta.Spec.Interruptible {
		return false, ""
	}
	limit, how := p.FailureThreshold, ""
	switch {
	case p.FailureThreshold == 0:
		return true, ""
	case p.FailureThreshold < 0:
		limit = p.MaxSystemFailures + p.FailureThreshold
		how = fmt.Sprintf(" (maxSystemFailures %d less %d)", p.MaxSystemFailures, -p.FailureThreshold)
	}
	failures := ta.Status.SystemFailures
	if failures < limit {
		return true, ""
	}
	noun := "system failures"
	if failures == 1 {
		noun = "system failure"
	}
	return false, fmt.Sprintf("runs on on-demand capacity: %d %s reached k8s.interruptibleFailureThreshold %d%s",
		failures, noun, p.FailureThreshold, how)
}
