package controller

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/internal/textbound"
)

// The one policy for a plugin's Abort and Finalize errors: the outcome that needed them
// waits. While the action runs, the error counts as a system failure and the pass runs
// again after the backoff (settle); once the system budget is spent the action fails,
// and what the plugin could not let go of is logged, not waited for (releaseOrLog).
// While the action is being deleted, the pass is retried until the plugin lets go: that
// is what the finalizer is for (reconcileDelete).

// release has the plugin let go of the current attempt: Abort first when abort, then
// Finalize. It returns the failure's code and error.
func (s *scope) release(ctx context.Context, abort bool) (string, error) {
	attempt := s.ta.Status.Attempts
	if abort {
		if err := s.plugin.Abort(ctx, s.tCtx); err != nil {
			return "AbortFailed", fmt.Errorf("aborting attempt %d: %w", attempt, err)
		}
	}
	if err := s.plugin.Finalize(ctx, s.tCtx); err != nil {
		return "FinalizeFailed", fmt.Errorf("finalizing attempt %d: %w", attempt, err)
	}
	return "", nil
}

// releaseOrLog aborts and finalizes an attempt whose action fails for good.
func (s *scope) releaseOrLog(ctx context.Context) {
	if _, err := s.release(ctx, true); err != nil {
		s.log.Warn("the plugin could not let go of the failed action's attempt", "error", err)
	}
}

// settle ends the current attempt with outcome once the plugin has let go of it.
func (s *scope) settle(ctx context.Context, abort bool, outcome func()) (ctrl.Result, error) {
	if code, err := s.release(ctx, abort); err != nil {
		return s.systemFailure(ctx, code, err.Error(), false)
	}
	outcome()
	return ctrl.Result{}, nil
}

// userFailure retries a failed attempt as a new one while the action's retries last.
func (s *scope) userFailure(ctx context.Context) (ctrl.Result, error) {
	execErr := toError(s.info.Err, s.info.Message)
	// Released before it is counted: a pass whose release fails is charged to the system
	// budget instead, and runs again, and must not count the user failure twice.
	if code, err := s.release(ctx, false); err != nil {
		return s.systemFailure(ctx, code, err.Error(), false)
	}
	// Counted, not derived from attempts: a system failure retried in place spends no
	// attempt, so attempts minus system failures would grant it a user retry.
	s.ta.Status.UserFailures++
	if s.ta.Status.UserFailures > s.ta.Spec.Retries {
		s.terminate(flytev1.PhaseFailed, flytev1.ReasonRetriesExhausted, execErr)
		return ctrl.Result{}, nil
	}
	return s.relaunch(execErr, s.ta.Status.UserFailures), nil
}

// systemFailure counts a failure of the platform against its own budget. A failed
// attempt (relaunch) is retried as a new attempt; a failed call into a live attempt is
// retried in place.
func (s *scope) systemFailure(ctx context.Context, code, message string, relaunch bool) (ctrl.Result, error) {
	st := &s.ta.Status
	st.SystemFailures++
	execErr := &flytev1.ExecutionError{Code: textbound.Fit(code, flytev1.MaxErrorCodeLength), Kind: flytev1.ErrorKindSystem, Message: textbound.Fit(message, flytev1.MaxErrorMessageLength)}
	s.log.Warn("system failure", "code", code, "message", message, "systemFailures", st.SystemFailures)
	if st.SystemFailures > s.r.Options.MaxSystemFailures {
		s.releaseOrLog(ctx)
		s.terminate(flytev1.PhaseFailed, flytev1.ReasonSystemError, execErr)
		return ctrl.Result{}, nil
	}
	if relaunch {
		code, err := s.release(ctx, false)
		if err == nil {
			return s.relaunch(execErr, st.SystemFailures), nil
		}
		// Charged once for this pass: the failed attempt is released on the next one.
		execErr = &flytev1.ExecutionError{Code: code, Kind: flytev1.ErrorKindSystem, Message: textbound.Fit(err.Error(), flytev1.MaxErrorMessageLength)}
	}
	st.Error = execErr
	wait := s.r.Options.Backoff.Delay(st.SystemFailures)
	s.r.Metrics.Retried(metrics.RetrySystem)
	s.r.Metrics.BackedOff(metrics.RetrySystem, wait)
	next := metav1.NewTime(s.now.Add(wait))
	st.NextAttemptAt = &next
	return ctrl.Result{RequeueAfter: wait}, nil
}

// relaunch ends the current attempt, which the plugin has let go of, and schedules a new
// one, with a new number, after a backoff that grows with failures (the n-th of its kind).
func (s *scope) relaunch(execErr *flytev1.ExecutionError, n int32) ctrl.Result {
	st := &s.ta.Status
	st.Error = execErr
	s.endAttempt(execErr)
	st.Attempts++
	st.AttemptStartedAt = nil // once its backoff is over (startAttempt)
	st.PluginState, st.PluginPhase, st.PluginPhaseVersion = nil, "", 0
	wait := s.r.Options.Backoff.Delay(n)
	kind := metrics.RetryUser
	if execErr.Kind == flytev1.ErrorKindSystem {
		kind = metrics.RetrySystem
	}
	s.r.Metrics.Retried(kind)
	s.r.Metrics.BackedOff(kind, wait)
	next := metav1.NewTime(s.now.Add(wait))
	st.NextAttemptAt = &next
	message := fmt.Sprintf("attempt %d failed (%s: %s); attempt %d starts in %s", st.Attempts-1, execErr.Code, execErr.Message, st.Attempts, wait.Round(time.Millisecond))
	if why := s.onDemand(); why != "" {
		// Kept whole however long the error: it is why the attempt's pod lands elsewhere.
		note := fmt.Sprintf("; attempt %d %s", st.Attempts, why)
		message = textbound.Fit(message, flytev1.MaxHistoryMessageLength-len(note)) + note
	}
	s.setPhase(flytev1.PhaseQueued, flytev1.ReasonRetrying, message)
	return ctrl.Result{RequeueAfter: wait}
}

// endAttempt closes the history of a failed attempt that is retried with an entry of its
// own: Failed, with the attempt's error and what the plugin reported in this pass (log
// links, Kubernetes events), so that none of it lands under the next attempt. The
// action's phase and conditions are the next attempt's, which the caller sets.
func (s *scope) endAttempt(execErr *flytev1.ExecutionError) {
	st := &s.ta.Status
	appendHistory(st, flytev1.PhaseTransition{
		Phase: flytev1.PhaseFailed, Attempt: max(st.Attempts, 1), Reason: flytev1.ReasonAttemptFailed,
		Message: textbound.Fit(execErr.Code+": "+execErr.Message, flytev1.MaxHistoryMessageLength), Error: execErr.DeepCopy(),
		OccurredAt: metav1.NewMicroTime(s.now.Time), CacheStatus: st.CacheStatus, LogLinks: s.logLinks, ClusterEvents: s.clusterEvents,
	})
	s.logLinks, s.clusterEvents = nil, nil
}

// terminate ends the action in a terminal phase.
func (s *scope) terminate(phase flytev1.Phase, reason string, execErr *flytev1.ExecutionError) {
	if phase != flytev1.PhaseSucceeded && s.r.Cache != nil && cacheclient.Enabled(s.ta) {
		// Not cancelled with the reconcile, but still part of its trace.
		s.r.Cache.Release(trace.ContextWithSpan(context.Background(), s.span), s.ta)
	}
	s.ta.Status.Error = execErr
	s.ta.Status.NextAttemptAt = nil
	message := ""
	if execErr != nil {
		message = execErr.Message
	}
	s.setPhase(phase, reason, message)
}

// fail ends an action that cannot run at all (an unknown task type, an invalid spec).
func (s *scope) fail(reason string, kind flytev1.ErrorKind, message string) {
	if s.ta.Status.Attempts == 0 {
		s.ta.Status.Attempts = 1
	}
	s.terminate(flytev1.PhaseFailed, reason, &flytev1.ExecutionError{Code: reason, Kind: kind, Message: textbound.Fit(message, flytev1.MaxErrorMessageLength)})
}

func toError(e *core.ExecutionError, message string) *flytev1.ExecutionError {
	if e == nil {
		return &flytev1.ExecutionError{Code: "Unknown", Kind: flytev1.ErrorKindUser, Message: textbound.Fit(message, flytev1.MaxErrorMessageLength)}
	}
	kind := flytev1.ErrorKindUser
	if e.Kind == core.ErrorKindSystem {
		kind = flytev1.ErrorKindSystem
	}
	return &flytev1.ExecutionError{Code: textbound.Fit(e.Code, flytev1.MaxErrorCodeLength), Kind: kind, Message: textbound.Fit(e.Message, flytev1.MaxErrorMessageLength)}
}
