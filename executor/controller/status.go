package controller

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/internal/textbound"
)

// maxPhaseHistory bounds the history kept in the status (the CRD allows 256); the oldest
// entries of a very long-lived action go first, keeping it append-only in spirit while
// the object stays small.
const maxPhaseHistory = 200

// setPhase moves the action to phase: a history entry when there is something new to
// report, the conditions, a log line, the phase metric and, for a change that needs a
// person's attention, a Kubernetes Warning event.
func (s *scope) setPhase(phase flytev1.Phase, reason, message string) {
	if !recordPhase(s.ta, phase, reason, message, s.now, s.newVersion, s.logLinks, s.clusterEvents) {
		return
	}
	// Every change is in the status and goes to the events service; a Kubernetes Event
	// for each would be a second API write per change (the status write being the
	// first), so only failures, timeouts and retries get one, for kubectl describe.
	if s.r.Recorder != nil && (phase == flytev1.PhaseFailed || phase == flytev1.PhaseTimedOut || reason == flytev1.ReasonRetrying) {
		s.r.Recorder.Event(s.ta, corev1.EventTypeWarning, reason, cmp.Or(message, string(phase)))
	}
	s.log.Info("phase changed", "phase", phase, "reason", reason, "attempt", s.ta.Status.Attempts)
	s.r.Metrics.PhaseChanged(string(phase))
}

// recordPhase writes phase into the status: a history entry when there is something new
// (a new attempt, a new version of the plugin's phase, or Kubernetes events to report is
// a change even in the same phase: the plugin manager reads events once per change of
// the plugin's phase, so events left out here would never be reported), and the
// conditions. It reports whether the history changed.
func recordPhase(ta *flytev1.TaskAction, phase flytev1.Phase, reason, message string, now metav1.Time, newVersion bool, links []flytev1.LogLink, events []flytev1.ClusterEvent) bool {
	st := &ta.Status
	attempt := max(st.Attempts, 1)
	// The first entry is always written: a held action is Queued before its history
	// begins (awaitEventsBacklog).
	changed := len(st.PhaseHistory) == 0 || st.Phase != phase || newVersion || len(events) > 0
	if last, ok := st.PhaseHistory.Last(); ok && last.Attempt != attempt {
		changed = true
	}
	if changed {
		st.Phase = phase
		entry := flytev1.PhaseTransition{
			Phase: phase, Attempt: attempt, Reason: textbound.Fit(reason, flytev1.MaxReasonLength), Message: textbound.Fit(message, flytev1.MaxHistoryMessageLength),
			OccurredAt: metav1.NewMicroTime(now.Time), CacheStatus: st.CacheStatus, LogLinks: links, ClusterEvents: events,
		}
		if phase == flytev1.PhaseSucceeded {
			entry.OutputsURI = st.OutputsURI
		} else if st.Error != nil && phase.IsTerminal() {
			entry.Error = st.Error.DeepCopy()
		}
		appendHistory(st, entry)
	}
	if st.StartedAt == nil && phase != flytev1.PhaseQueued {
		st.StartedAt = &now
	}
	setConditions(ta, phase, reason, message, now)
	return changed
}

// setConditions sets the conditions (and the completion time) of phase.
func setConditions(ta *flytev1.TaskAction, phase flytev1.Phase, reason, message string, now metav1.Time) {
	if phase.IsTerminal() {
		ta.Status.CompletedAt = &now
	}
	if reason == "" {
		reason = string(phase)
	}
	applyConditions(&ta.Status.Conditions, phase, reason, textbound.Fit(message, flytev1.MaxConditionMessageLength), now, ta.Generation)
}

// applyConditions sets every condition as phase has it, each with reason and message:
// the one mapping of phase to conditions (flytev1's condition constants say it in
// words). Reconciling and Stalled are removed, not made False, where they do not hold,
// as kstatus and Flux's condition rules expect; Failed is absent unless True, as it has
// always been.
func applyConditions(conds *[]metav1.Condition, phase flytev1.Phase, reason, message string, now metav1.Time, generation int64) {
	set := func(typ string, status metav1.ConditionStatus) {
		meta.SetStatusCondition(conds, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: message,
			ObservedGeneration: generation, LastTransitionTime: now,
		})
	}
	switch {
	case phase == flytev1.PhaseSucceeded:
		set(flytev1.ConditionProgressing, metav1.ConditionFalse)
		set(flytev1.ConditionSucceeded, metav1.ConditionTrue)
		set(flytev1.ConditionFinished, metav1.ConditionTrue)
		set(flytev1.ConditionReady, metav1.ConditionTrue)
		meta.RemoveStatusCondition(conds, flytev1.ConditionReconciling)
		meta.RemoveStatusCondition(conds, flytev1.ConditionStalled)
	case phase.IsTerminal():
		set(flytev1.ConditionProgressing, metav1.ConditionFalse)
		set(flytev1.ConditionSucceeded, metav1.ConditionFalse)
		set(flytev1.ConditionFailed, metav1.ConditionTrue)
		set(flytev1.ConditionFinished, metav1.ConditionTrue)
		set(flytev1.ConditionReady, metav1.ConditionFalse)
		set(flytev1.ConditionStalled, metav1.ConditionTrue)
		meta.RemoveStatusCondition(conds, flytev1.ConditionReconciling)
	default:
		set(flytev1.ConditionProgressing, metav1.ConditionTrue)
		set(flytev1.ConditionSucceeded, metav1.ConditionUnknown)
		set(flytev1.ConditionFinished, metav1.ConditionFalse)
		set(flytev1.ConditionReady, metav1.ConditionFalse)
		set(flytev1.ConditionReconciling, metav1.ConditionTrue)
		meta.RemoveStatusCondition(conds, flytev1.ConditionStalled)
	}
}

// restateConditions brings every condition in line with the phase and with the
// Progressing condition, which every executor has kept: an executor of v0.2.0 or before
// (a rollback, or objects it finished before the upgrade) moves only Progressing,
// Succeeded (to True) and Failed, and leaves the others as it found them, absent or
// stale (Reconciling True on an action it finished). It writes nothing in a pass of
// this executor's own objects, whose conditions setConditions keeps in line; what it
// restores takes Progressing's reason, message, generation and time.
func restateConditions(ta *flytev1.TaskAction) {
	progressing := meta.FindStatusCondition(ta.Status.Conditions, flytev1.ConditionProgressing)
	if progressing == nil || ta.Status.Phase == "" {
		return // nothing written yet: the pass writes them with the first phase
	}
	p := *progressing
	applyConditions(&ta.Status.Conditions, ta.Status.Phase, p.Reason, p.Message, p.LastTransitionTime, p.ObservedGeneration)
}

// appendHistory adds entry to the history, numbered as the history numbers it
// (NextVersion): the last entry is never dropped, so the numbers of an attempt only grow
// and every entry is a distinct event, however many older ones went. An entry that
// repeats the last one (the same attempt, phase and reason, nothing else to report)
// replaces it with a count, so a wait refused again and again for a day stays one entry;
// it still gets a new version, and so reaches the events service. The oldest entries go
// beyond maxPhaseHistory.
func appendHistory(st *flytev1.TaskActionStatus, entry flytev1.PhaseTransition) {
	entry.Version = st.PhaseHistory.NextVersion(entry.Attempt)
	if last, ok := st.PhaseHistory.Last(); ok && repeats(&last, &entry) {
		entry.Count = max(last.Count, 1) + 1
		st.PhaseHistory[len(st.PhaseHistory)-1] = entry
		return
	}
	st.PhaseHistory = append(st.PhaseHistory, entry)
	if len(st.PhaseHistory) > maxPhaseHistory {
		st.PhaseHistory = st.PhaseHistory[len(st.PhaseHistory)-maxPhaseHistory:]
	}
}

// repeats reports whether next says again what last said: folding it loses nothing
// but last's message and time.
func repeats(last, next *flytev1.PhaseTransition) bool {
	return last.Attempt == next.Attempt && last.Phase == next.Phase && last.Reason == next.Reason &&
		!next.Phase.IsTerminal() && last.Error == nil && next.Error == nil &&
		len(last.ClusterEvents) == 0 && len(next.ClusterEvents) == 0 &&
		last.CacheStatus == next.CacheStatus && slices.Equal(last.LogLinks, next.LogLinks)
}
