package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/storage"
	"github.com/flytekube/backend/internal/textbound"
)

// step is one part of a pass over a live action. It changes only the action's status,
// in memory, which closePass writes at the end of the pass; ensureFinalizer alone writes
// (the finalizer, before anything else).
//
// Steps run in order, until one ends the pass: a step that returns an error (retried
// after the work queue's backoff) or a non-zero result (it waits for something: the
// result says when to look again) ends it with what it returned, and so does a step
// that finishes the action. A zero result on an unfinished action lets the next step run.
type step func(ctx context.Context) (ctrl.Result, error)

// runSteps runs steps as step says, and returns what the last one run returned.
func (s *scope) runSteps(ctx context.Context, steps ...step) (ctrl.Result, error) {
	for _, run := range steps {
		if result, err := run(ctx); err != nil || !result.IsZero() || s.ta.Status.Phase.IsTerminal() || s.held {
			return result, err
		}
	}
	return ctrl.Result{}, nil
}

// lowestNonZeroResult is the sooner of two requeues, as cluster-api's
// util.LowestNonZeroResult: a zero result (no requeue) gives way to the other.
func lowestNonZeroResult(i, j ctrl.Result) ctrl.Result {
	switch {
	case i.IsZero():
		return j
	case j.IsZero():
		return i
	case j.RequeueAfter < i.RequeueAfter:
		return j
	}
	return i
}

// reconcileActive is a pass over an action that is neither finished nor deleted.
func (s *scope) reconcileActive(ctx context.Context) (ctrl.Result, error) {
	return s.runSteps(ctx,
		s.checkTenancy,
		s.awaitEventsBacklog,
		s.ensureFinalizer,
		s.resolvePlugin,
		s.validateSpec,
		s.boundWrittenTimes,
		s.startAttempt,
		s.consultCache,
		s.enforceTimeout,
		s.handle,
		s.transition,
	)
}

// ensureFinalizer puts the finalizer on an action that will need it before anything
// else is done, as cluster-api's controllers do; unlike them, the pass then goes on
// rather than ending: the patch is stored (it returned the new object), so nothing the
// pass does next can outrun it. Ending the pass cost a trip through the queue per
// action, behind every action created meanwhile: a third more reconciles and about 30 %
// more latency under a burst, for nothing (docs/benchmarks.md, "The finalizer's pass").
// An action whose need shows only at the end of a pass gets it there (closePass).
func (s *scope) ensureFinalizer(ctx context.Context) (ctrl.Result, error) {
	if s.holdsFinalizer() || !s.needsFinalizer() {
		return ctrl.Result{}, nil
	}
	if err := s.addFinalizer(ctx); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// resolvePlugin finds the plugin of the action's task type; an unknown type fails the
// action.
func (s *scope) resolvePlugin(context.Context) (ctrl.Result, error) {
	p, err := s.resolve(s.ta.Spec.TaskType)
	switch {
	case errors.Is(err, core.ErrUnknownTaskType):
		s.fail(flytev1.ReasonUnknownTaskType, flytev1.ErrorKindUser, err.Error())
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("resolving the plugin of task type %q: %w", s.ta.Spec.TaskType, err)
	default:
		s.plugin = p
	}
	return ctrl.Result{}, nil
}

// validateSpec fails an action whose spec is wrong in a way the CRD schema cannot tell.
func (s *scope) validateSpec(context.Context) (ctrl.Result, error) {
	if msg := s.specError(); msg != "" {
		s.fail(flytev1.ReasonInvalidSpec, flytev1.ErrorKindUser, msg)
	}
	return ctrl.Result{}, nil
}

// specError says what the CRD schema cannot check and is wrong in the spec (a URI that
// does not parse); empty when nothing is.
func (s *scope) specError() string {
	for field, v := range map[string]string{"spec.inputUri": s.ta.Spec.InputURI, "spec.runOutputBase": s.ta.Spec.RunOutputBase} {
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || u.Scheme == "" {
			return fmt.Sprintf("%s: %q is not a URI such as s3://bucket/path", field, v)
		}
	}
	return ""
}

// awaitEventsBacklog holds an action that has not started (it has no history) while the
// finished actions whose history waits for the events service are at their bound. Its
// status says so, Queued for EventsBacklog, in one write the first time (a pass that
// finds it held again writes nothing), and nothing else is done for it: no finalizer, no
// history entry (which would itself wait for the events service, adding to the backlog
// it waits on), no plugin. Deleted, it goes at once, with nothing to report, as an
// action deleted before its first pass. The backlog queues it again when there is room.
// An action with history has started and is never held.
func (s *scope) awaitEventsBacklog(context.Context) (ctrl.Result, error) {
	if s.r.Backlog == nil || s.admitted || len(s.ta.Status.PhaseHistory) > 0 {
		return ctrl.Result{}, nil
	}
	if s.r.Backlog.Admit(client.ObjectKeyFromObject(s.ta), s.ta.UID) {
		s.admitted = true
		return ctrl.Result{}, nil
	}
	s.held = true
	s.ta.Status.Phase = flytev1.PhaseQueued
	// The message names the bound, not the count, which changes: a message that changed
	// at each look would be a write at each look.
	setConditions(s.ta, flytev1.PhaseQueued, flytev1.ReasonEventsBacklog, fmt.Sprintf(
		"waiting to start: the history of %d finished actions waits for the events service (the executor's "+
			"eventsBacklog.maxUndeliveredFinished); the action starts once it is delivered", s.r.Backlog.Bound()), s.now)
	return ctrl.Result{}, nil
}

// heldFor says, for the first history entry, how long the action was held for the
// events backlog; empty when it was not.
func (s *scope) heldFor() string {
	c := meta.FindStatusCondition(s.ta.Status.Conditions, flytev1.ConditionProgressing)
	if c == nil || c.Reason != flytev1.ReasonEventsBacklog {
		return ""
	}
	return fmt.Sprintf("started after waiting %s for the events service's backlog (%s)",
		s.now.Sub(c.LastTransitionTime.Time).Round(time.Second), flytev1.ReasonEventsBacklog)
}

// joinNotes joins the non-empty notes with "; ".
func joinNotes(notes ...string) string {
	return strings.Join(slices.DeleteFunc(notes, func(n string) bool { return n == "" }), "; ")
}

// startAttempt queues a new action's first attempt, and holds a retried attempt until
// its backoff is over.
func (s *scope) startAttempt(context.Context) (ctrl.Result, error) {
	st := &s.ta.Status
	if st.Attempts == 0 {
		st.Attempts = 1
		s.setPhase(flytev1.PhaseQueued, flytev1.ReasonQueued, joinNotes(s.heldFor(), s.onDemand()))
	}
	if next := st.NextAttemptAt; next != nil {
		if wait := next.Sub(s.now.Time); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		st.NextAttemptAt = nil
	}
	if st.AttemptStartedAt == nil {
		// The timeout runs from here: a retried attempt's backoff is not its time.
		st.AttemptStartedAt = s.attemptStart()
	}
	s.tCtx = s.executionContext(st.Attempts)
	return ctrl.Result{}, nil
}

// consultCache looks a cacheable action up before its first run: a hit finishes it
// without running anything; a reservation held by an identical action makes it wait.
func (s *scope) consultCache(ctx context.Context) (ctrl.Result, error) {
	ta := s.ta
	switch {
	case !cacheclient.Enabled(ta) || s.plugin.GetProperties().DisableNodeLevelCaching:
		ta.Status.CacheStatus = flytev1.CacheDisabled
		return ctrl.Result{}, nil
	case s.r.Cache == nil:
		ta.Status.CacheStatus = flytev1.CacheSkipped
		return ctrl.Result{}, nil
	case ta.Status.CacheStatus != "":
		if ta.Status.CacheStatus == flytev1.CacheMiss {
			s.r.Cache.Resume(ctx, ta)
		}
		return ctrl.Result{}, nil
	}
	d := s.r.Cache.Lookup(ctx, ta, s.tCtx.OutputWriter().OutputsURI())
	switch {
	case d.Hit:
		s.r.Metrics.CacheLookedUp("hit")
		ta.Status.CacheStatus = flytev1.CacheHit
		ta.Status.OutputsURI = d.OutputsURI
		s.terminate(flytev1.PhaseSucceeded, flytev1.ReasonCacheHit, nil)
		return ctrl.Result{}, nil
	case d.Wait > 0:
		s.r.Metrics.CacheLookedUp("wait")
		s.r.Metrics.BackedOff(metrics.WaitResources, d.Wait)
		s.setPhase(flytev1.PhaseWaitingForResources, flytev1.ReasonWaitingForCache, s.waitingOn(d))
		return ctrl.Result{RequeueAfter: d.Wait}, nil
	case d.Overwrite:
		s.r.Metrics.CacheLookedUp("overwrite")
	case d.Stale:
		s.r.Metrics.CacheLookedUp("stale")
	case d.Status == flytev1.CacheSkipped:
		s.r.Metrics.CacheLookedUp("skipped")
	default:
		s.r.Metrics.CacheLookedUp("miss")
	}
	ta.Status.CacheStatus = d.Status
	return ctrl.Result{}, nil
}

// waitingOn says whom an action waits on for the cache, and until when the holder's
// reservation runs unless renewed. The holder renews it with every heartbeat, so the
// expiry is the one seen when the wait on this holder began: a message changed at each
// look would be a status write at each look.
func (s *scope) waitingOn(d cacheclient.Decision) string {
	prefix := "waiting on " + d.Holder + ", an identical action computing the same outputs"
	if c := meta.FindStatusCondition(s.ta.Status.Conditions, flytev1.ConditionProgressing); c != nil &&
		c.Reason == flytev1.ReasonWaitingForCache && strings.HasPrefix(c.Message, prefix) {
		return c.Message
	}
	return fmt.Sprintf("%s (its reservation runs to %s unless renewed)", prefix, d.HolderExpires.UTC().Format(time.RFC3339))
}

// enforceTimeout ends an attempt that ran past spec.timeout.
func (s *scope) enforceTimeout(ctx context.Context) (ctrl.Result, error) {
	timeout := s.ta.Spec.Timeout
	if timeout == nil || s.timeLeft() > 0 {
		return ctrl.Result{}, nil
	}
	attempt := s.ta.Status.Attempts
	return s.settle(ctx, true, func() {
		s.terminate(flytev1.PhaseTimedOut, flytev1.ReasonTimedOut, &flytev1.ExecutionError{
			Code: "Timeout", Kind: flytev1.ErrorKindUser, Message: fmt.Sprintf("attempt %d ran longer than %s", attempt, timeout.Duration),
		})
	})
}

// timeLeft is what remains of the attempt's spec.timeout.
func (s *scope) timeLeft() time.Duration {
	started := s.now.Time
	if st := s.ta.Status.AttemptStartedAt; st != nil {
		started = st.Time
	}
	return started.Add(s.ta.Spec.Timeout.Duration).Sub(s.now.Time)
}

// attemptStart is when the current attempt started, for a status that does not say: now,
// or, for an action running since before the status had attemptStartedAt, its attempt's
// first history entry, from which timeouts were measured then.
func (s *scope) attemptStart() *metav1.Time {
	st := &s.ta.Status
	started := s.now
	if i := slices.IndexFunc(st.PhaseHistory, func(h flytev1.PhaseTransition) bool { return h.Attempt == st.Attempts }); i >= 0 && st.PluginPhase != "" {
		started = metav1.NewTime(st.PhaseHistory[i].OccurredAt.Time)
	}
	return &started
}

// handle lets the plugin advance the attempt and keeps what it reported (its phase, log
// links and Kubernetes events) for transition. A failed call ends the pass.
func (s *scope) handle(ctx context.Context) (ctrl.Result, error) {
	tr, err := s.plugin.Handle(ctx, s.tCtx)
	if core.IsTransient(err) {
		s.r.Metrics.Retried(metrics.RetryTransient)
		// The API server or a service had a bad moment: the same step runs again after
		// the queue's backoff, and the action is not charged for it.
		return ctrl.Result{}, fmt.Errorf("plugin %s: %w", s.plugin.GetID(), err)
	}
	if storage.IsNotAllowed(err) {
		// Inputs or outputs where storage.allowedPrefixes let no action go: that is how
		// the executor is configured, which no retry changes, so the action fails now,
		// naming the setting, rather than after its system budget.
		return s.settle(ctx, true, func() {
			s.terminate(flytev1.PhaseFailed, flytev1.ReasonStorageNotAllowed, &flytev1.ExecutionError{Code: flytev1.ReasonStorageNotAllowed,
				Kind: flytev1.ErrorKindSystem, Message: textbound.Fit(err.Error(), flytev1.MaxErrorMessageLength)})
		})
	}
	if err != nil {
		return s.systemFailure(ctx, "PluginError", err.Error(), false)
	}
	info := tr.Info
	st := &s.ta.Status
	// A new version within the same phase (a new reason, say) is reported like a new phase.
	s.newVersion = st.PluginPhase == info.Phase.String() && st.PluginPhaseVersion != int32(info.Version)
	for _, l := range info.LogLinks {
		// A link the events service would refuse would hold the action's events back.
		if l.Name == "" || !core.IsAbsoluteURI(l.URI) || len(s.logLinks) == flytev1.MaxLogLinks {
			s.log.Warn("plugin log link left out: it needs a name and an absolute URI, and at most 8 per phase", "link", l.Name, "uri", l.URI)
			continue
		}
		s.logLinks = append(s.logLinks, flytev1.LogLink{Name: textbound.Fit(l.Name, flytev1.MaxLogLinkNameLength), URI: textbound.Fit(l.URI, flytev1.MaxLogLinkURILength)})
	}
	for _, e := range info.ClusterEvents {
		s.clusterEvents = append(s.clusterEvents, flytev1.ClusterEvent{OccurredAt: metav1.NewTime(e.OccurredAt),
			Object: textbound.Fit(e.Object, flytev1.MaxClusterEventObjectLength), Type: textbound.Fit(e.Type, flytev1.MaxClusterEventTypeLength),
			Reason: textbound.Fit(e.Reason, flytev1.MaxReasonLength), Message: textbound.Fit(e.Message, flytev1.MaxClusterEventMessageLength),
			Source: textbound.Fit(e.Source, flytev1.MaxClusterEventSourceLength), Count: e.Count})
	}
	st.PluginPhase, st.PluginPhaseVersion = info.Phase.String(), int32(info.Version)
	s.info = info
	return ctrl.Result{}, nil
}

// transition moves the action to the phase the plugin reported: a phase of a running
// attempt, to be looked at again when lookAgain says, or an outcome, which waits until
// the plugin has finalized the attempt.
func (s *scope) transition(ctx context.Context) (ctrl.Result, error) {
	info := s.info
	switch info.Phase {
	case core.PhaseNotReady, core.PhaseWaitingForResources:
		if info.RequeueAfter > 0 {
			s.r.Metrics.BackedOff(metrics.WaitResources, info.RequeueAfter)
		}
		s.setPhase(flytev1.PhaseWaitingForResources, cmp.Or(info.Reason, flytev1.ReasonWaitingForResources), info.Message)
	case core.PhaseQueued:
		s.setPhase(flytev1.PhaseQueued, cmp.Or(info.Reason, flytev1.ReasonQueued), info.Message)
	case core.PhaseInitializing:
		s.setPhase(flytev1.PhaseInitializing, cmp.Or(info.Reason, flytev1.ReasonInitializing), info.Message)
	case core.PhaseRunning:
		s.setPhase(flytev1.PhaseRunning, cmp.Or(info.Reason, flytev1.ReasonRunning), info.Message)
	case core.PhaseSuccess:
		return s.settle(ctx, false, func() { s.succeed(ctx) })
	case core.PhaseRetryableFailure:
		if info.Err != nil && info.Err.Kind == core.ErrorKindSystem {
			return s.systemFailure(ctx, info.Err.Code, info.Err.Message, true)
		}
		return s.userFailure(ctx)
	case core.PhasePermanentFailure:
		return s.settle(ctx, false, func() {
			s.terminate(flytev1.PhaseFailed, cmp.Or(info.Reason, flytev1.ReasonUserError), toError(info.Err, info.Message))
		})
	default:
		return s.systemFailure(ctx, "UndefinedPhase", fmt.Sprintf("plugin %s returned phase %s", s.plugin.GetID(), info.Phase), false)
	}
	return s.lookAgain(), nil
}

// lookAgain is when a running attempt is looked at again if nothing wakes it sooner (its
// pod changing, say): when the plugin asked to be, or when the attempt's timeout runs
// out, whichever comes first; never, if neither applies.
func (s *scope) lookAgain() ctrl.Result {
	result := ctrl.Result{RequeueAfter: s.info.RequeueAfter}
	if s.ta.Spec.Timeout != nil {
		// enforceTimeout, earlier in the pass, saw time left.
		result = lowestNonZeroResult(result, ctrl.Result{RequeueAfter: s.timeLeft()})
	}
	return result
}

// succeed records a successful attempt's outputs and offers them to the cache.
func (s *scope) succeed(ctx context.Context) {
	st := &s.ta.Status
	st.OutputsURI = s.info.OutputsURI
	st.Error = nil
	if s.r.Cache != nil && (st.CacheStatus == flytev1.CacheMiss || st.CacheStatus == flytev1.CacheSkipped) {
		st.CacheStatus = s.r.Cache.Store(ctx, s.ta, s.info.OutputsURI)
		s.r.Metrics.CachePut(string(st.CacheStatus))
	}
	s.terminate(flytev1.PhaseSucceeded, flytev1.ReasonSucceeded, nil)
}
