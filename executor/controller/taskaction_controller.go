// Package controller reconciles TaskAction resources: it drives each action's plugin
// through attempts, retries user and system failures against separate budgets with
// backoff, enforces timeouts, and runs Abort and Finalize when an action is deleted.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cache"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/plugin"
	"github.com/flytekube/backend/executor/tracing"
)

// staleCacheWait is how long a reconcile that found the cache behind our own write waits
// before looking again.
const staleCacheWait = 50 * time.Millisecond

// transientRetryBase is the first wait before a pass that failed on a transient error
// runs again; it doubles with each failure in a row.
const transientRetryBase = 100 * time.Millisecond

const (
	// Finalizer keeps a deleted action until its plugin has aborted and finalized.
	Finalizer = "flyte.org/plugin-finalizer"
	// LabelTerminal marks finished actions, for the garbage collector.
	LabelTerminal = "flyte.org/terminal"
)

// Options tune the reconciler.
type Options struct {
	// DefaultServiceAccount applies to actions that name none.
	DefaultServiceAccount string
	// MaxSystemFailures is how many system failures an action survives.
	MaxSystemFailures int32
	// Backoff spaces attempts.
	Backoff Backoff
	// MaxConcurrentReconciles is the number of workers.
	MaxConcurrentReconciles int
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
}

// EventSink delivers the phase history the reconciler writes to the events service; a
// nil sink turns events off.
type EventSink interface {
	// Enqueue asks for the undelivered history of ta, as just written, to be delivered.
	Enqueue(ta *flytev1.TaskAction)
	// Delivered reports whether all of ta's history was delivered, and the mark to keep
	// in its AnnotationEventsDelivered.
	Delivered(ta *flytev1.TaskAction) (bool, string)
	// Forget drops what the sink knows of an action that is gone.
	Forget(types.NamespacedName)
	// Source wakes the reconciler when a finished action's history has been delivered.
	Source() source.Source
}

// TaskActionReconciler reconciles TaskActions.
type TaskActionReconciler struct {
	Client    client.Client
	Registry  *plugin.Registry
	DataStore plugin.DataStore
	Resources plugin.ResourceManager
	Recorder  record.EventRecorder
	Clock     clock.PassiveClock
	Log       *slog.Logger
	Events    EventSink
	// Cache memoizes outputs of cacheable actions; nil turns caching off.
	Cache   *cache.Cache
	Options Options
	// Observe, when set, is called at the start of every reconcile; tests count them.
	Observe func(ctrl.Request)
	// TracerProvider receives the spans of reconciles and plugin calls; nil means the
	// global one.
	TracerProvider trace.TracerProvider

	tracerOnce sync.Once
	tr         trace.Tracer

	// written remembers, per action, how long the phase history was when this process
	// last wrote it. The informer cache can lag behind our own writes; a reconcile that
	// sees a shorter history would redo a step and fail on a conflict, so it waits for
	// the cache instead (the "expectations" of Kubernetes' own controllers).
	written sync.Map // types.UID -> int
}

func resultLabel(r ctrl.Result, err error) string {
	switch {
	case err != nil:
		return "error"
	case r.RequeueAfter > 0:
		return "requeue"
	}
	return "success"
}

// Reconcile advances one action by one step.
func (r *TaskActionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if r.Observe != nil {
		r.Observe(req)
	}
	var ta flytev1.TaskAction
	if err := r.Client.Get(ctx, req.NamespacedName, &ta); err != nil {
		if apierrors.IsNotFound(err) {
			metrics.ForgetAction(req.NamespacedName)
			if r.Events != nil {
				r.Events.Forget(req.NamespacedName)
			}
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if n, ok := r.written.Load(ta.UID); ok {
		if len(ta.Status.PhaseHistory) < n.(int) {
			return ctrl.Result{RequeueAfter: staleCacheWait}, nil
		}
		r.written.Delete(ta.UID)
	}
	// Every reconcile of the action is a span of the action's one trace (see tracing).
	ctx, span := r.tracer().Start(tracing.ContextWithAction(ctx, ta.UID), "TaskAction.Reconcile")
	log := r.Log.With("namespace", ta.Namespace, "taskAction", ta.Name, "project", ta.Spec.Project,
		"domain", ta.Spec.Domain, "run", ta.Spec.RunName, "action", ta.Spec.ActionName)
	s := &scope{r: r, ta: &ta, log: log, now: metav1.NewTime(r.Clock.Now()), before: ta.Status.DeepCopy(), span: span}
	started := time.Now()
	result, err := s.reconcile(ctx)
	metrics.Reconciled(time.Since(started), resultLabel(result, err))
	metrics.ObservePhase(req.NamespacedName, or(string(ta.Status.Phase), string(flytev1.PhaseQueued)))
	if span.IsRecording() { // attributes cost allocations; not when tracing is off
		span.SetAttributes(tracing.ActionAttributes(&ta)...)
	}
	end(span, err)
	return result, err
}

func (r *TaskActionReconciler) tracer() trace.Tracer {
	r.tracerOnce.Do(func() {
		tp := r.TracerProvider
		if tp == nil {
			tp = otel.GetTracerProvider()
		}
		r.tr = tp.Tracer(tracing.ScopeName)
	})
	return r.tr
}

// reconcile is one pass over the action.
func (s *scope) reconcile(ctx context.Context) (ctrl.Result, error) {
	ta := s.ta
	if !ta.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, s.reconcileDelete(ctx)
	}
	if ta.Status.Phase.IsTerminal() {
		return ctrl.Result{}, s.markTerminal(ctx)
	}

	result, err := s.reconcileActive(ctx)
	if werr := s.writeStatus(ctx); werr != nil {
		return ctrl.Result{}, werr
	}
	if ta.Status.Phase.IsTerminal() {
		return ctrl.Result{}, errors.Join(err, s.markTerminal(ctx))
	}
	// An action still running after its first pass gets the finalizer, so that deleting
	// it aborts the attempt and reports it; one that finishes at once never needs it.
	if err == nil && !controllerutil.ContainsFinalizer(ta, Finalizer) {
		if ferr := s.addFinalizer(ctx); ferr != nil {
			return ctrl.Result{}, ferr
		}
	}
	return result, err
}

// writeStatus writes the status if this pass changed it, and hands new history to the
// event sink.
func (s *scope) writeStatus(ctx context.Context) error {
	if equality.Semantic.DeepEqual(s.before, &s.ta.Status) {
		return nil
	}
	s.ta.Status.ObservedGeneration = s.ta.Generation
	if err := s.r.Client.Status().Update(ctx, s.ta); err != nil {
		// A conflict means someone wrote meanwhile; Handle is idempotent, so the next
		// reconcile simply does this step again.
		return fmt.Errorf("updating status: %w", err)
	}
	if n := len(s.ta.Status.PhaseHistory); n != len(s.before.PhaseHistory) {
		s.r.written.Store(s.ta.UID, n)
	}
	if s.r.Events != nil && len(s.ta.Status.PhaseHistory) != len(s.before.PhaseHistory) {
		s.r.Events.Enqueue(s.ta)
	}
	s.before = s.ta.Status.DeepCopy()
	return nil
}

// addFinalizer adds the finalizer with a patch of the metadata alone. An update would
// send the whole object back as the Go types spell it ("0.5" CPUs as "500m", "90s" as
// "1m30s", an absent section as an empty one), which the CRD's immutable-spec rule
// refuses for an action written by hand.
func (s *scope) addFinalizer(ctx context.Context) error {
	status := s.ta.Status.DeepCopy()
	patch := client.MergeFromWithOptions(s.ta.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(s.ta, Finalizer)
	if err := s.r.Client.Patch(ctx, s.ta, patch); err != nil {
		return fmt.Errorf("adding finalizer: %w", err)
	}
	s.ta.Status = *status // the patch returned the stored status; keep ours
	return nil
}

// scope is one reconcile of one action.
type scope struct {
	r      *TaskActionReconciler
	ta     *flytev1.TaskAction
	before *flytev1.TaskActionStatus // as last written
	log    *slog.Logger
	now    metav1.Time
	// span is the reconcile's span.
	span trace.Span
	// newVersion: the plugin reported a new version of its phase in this pass.
	newVersion bool
	// logLinks and clusterEvents are what the plugin reported in this pass.
	logLinks      []flytev1.LogLink
	clusterEvents []flytev1.ClusterEvent
}

func (s *scope) executionContext(attempt int32) plugin.TaskExecutionContext {
	return plugin.NewTaskExecutionContext(plugin.ExecutionContextOptions{
		Action: s.ta, Attempt: attempt, DefaultServiceAccount: s.r.Options.DefaultServiceAccount,
		DataStore: s.r.DataStore, Secrets: s.r.Client, Resources: s.r.Resources, Clock: s.r.Clock.Now,
	})
}

func (s *scope) reconcileActive(ctx context.Context) (ctrl.Result, error) {
	ta := s.ta
	p, err := s.resolve(ta.Spec.TaskType)
	if errors.Is(err, plugin.ErrUnknownTaskType) {
		s.fail(flytev1.ReasonUnknownTaskType, flytev1.ErrorKindUser, err.Error())
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if msg := validate(ta); msg != "" {
		s.fail(flytev1.ReasonInvalidSpec, flytev1.ErrorKindUser, msg)
		return ctrl.Result{}, nil
	}
	// Plugins that create things outside the action get the finalizer before they do;
	// in-process plugins get it only if they outlive their first pass (see Reconcile).
	if p.GetProperties().NeedsFinalizer && !controllerutil.ContainsFinalizer(ta, Finalizer) {
		if err := s.addFinalizer(ctx); err != nil {
			return ctrl.Result{}, err
		}
	}

	if ta.Status.Attempts == 0 {
		ta.Status.Attempts = 1
		s.setPhase(flytev1.PhaseQueued, flytev1.ReasonQueued, "")
	}
	if next := ta.Status.NextAttemptAt; next != nil {
		if wait := next.Sub(s.now.Time); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		ta.Status.NextAttemptAt = nil
	}
	attempt := ta.Status.Attempts
	tCtx := s.executionContext(attempt)

	if done, result := s.consultCache(ctx, p, tCtx); done {
		return result, nil
	}

	if timeout := ta.Spec.Timeout; timeout != nil {
		started := s.attemptStart(attempt)
		if left := started.Add(timeout.Duration).Sub(s.now.Time); left <= 0 {
			s.abortAndFinalize(ctx, p, tCtx)
			s.terminate(flytev1.PhaseTimedOut, flytev1.ReasonTimedOut, &flytev1.ExecutionError{
				Code: "Timeout", Kind: flytev1.ErrorKindUser, Message: fmt.Sprintf("attempt %d ran longer than %s", attempt, timeout.Duration),
			})
			return ctrl.Result{}, nil
		}
	}

	tr, err := p.Handle(ctx, tCtx)
	if plugin.IsTransient(err) {
		metrics.Retried(metrics.RetryTransient)
		// The API server or a service had a bad moment: the same step runs again after
		// the queue's backoff, and the action is not charged for it.
		return ctrl.Result{}, fmt.Errorf("plugin %s: %w", p.GetID(), err)
	}
	if err != nil {
		return s.systemFailure(ctx, p, tCtx, "PluginError", err.Error(), false)
	}
	info := tr.Info
	// A new version within the same phase (a new reason, say) is reported like a new phase.
	s.newVersion = ta.Status.PluginPhase == info.Phase.String() && ta.Status.PluginPhaseVersion != int32(info.Version)
	for _, l := range info.LogLinks {
		// A link the events service would refuse would hold the action's events back.
		if l.Name == "" || !plugin.IsAbsoluteURI(l.URI) || len(s.logLinks) == flytev1.MaxLogLinks {
			s.log.Warn("plugin log link left out: it needs a name and an absolute URI, and at most 8 per phase", "link", l.Name, "uri", l.URI)
			continue
		}
		s.logLinks = append(s.logLinks, flytev1.LogLink{Name: fitText(l.Name, flytev1.MaxLogLinkNameLength), URI: fitText(l.URI, flytev1.MaxLogLinkURILength)})
	}
	for _, e := range info.ClusterEvents {
		s.clusterEvents = append(s.clusterEvents, flytev1.ClusterEvent{OccurredAt: metav1.NewTime(e.OccurredAt),
			Object: fitText(e.Object, flytev1.MaxClusterEventObjectLength), Type: fitText(e.Type, flytev1.MaxClusterEventTypeLength),
			Reason: fitText(e.Reason, flytev1.MaxReasonLength), Message: fitText(e.Message, flytev1.MaxClusterEventMessageLength), Count: e.Count})
	}
	ta.Status.PluginPhase, ta.Status.PluginPhaseVersion = info.Phase.String(), int32(info.Version)
	result := ctrl.Result{RequeueAfter: info.RequeueAfter}
	if timeout := ta.Spec.Timeout; timeout != nil && !info.Phase.IsTerminal() {
		// Wake up for the timeout even if nothing else happens.
		left := s.attemptStart(attempt).Add(timeout.Duration).Sub(s.now.Time)
		if result.RequeueAfter == 0 || left < result.RequeueAfter {
			result.RequeueAfter = left
		}
	}
	switch info.Phase {
	case plugin.PhaseNotReady, plugin.PhaseWaitingForResources:
		if info.RequeueAfter > 0 {
			metrics.BackedOff(metrics.WaitResources, info.RequeueAfter)
		}
		s.setPhase(flytev1.PhaseWaitingForResources, or(info.Reason, flytev1.ReasonWaitingForResources), info.Message)
	case plugin.PhaseQueued:
		s.setPhase(flytev1.PhaseQueued, or(info.Reason, flytev1.ReasonQueued), info.Message)
	case plugin.PhaseInitializing:
		s.setPhase(flytev1.PhaseInitializing, or(info.Reason, flytev1.ReasonInitializing), info.Message)
	case plugin.PhaseRunning:
		s.setPhase(flytev1.PhaseRunning, or(info.Reason, flytev1.ReasonRunning), info.Message)
	case plugin.PhaseSuccess:
		if err := p.Finalize(ctx, tCtx); err != nil {
			return s.systemFailure(ctx, p, tCtx, "FinalizeFailed", err.Error(), false)
		}
		ta.Status.OutputsURI = info.OutputsURI
		ta.Status.Error = nil
		if s.r.Cache != nil && (ta.Status.CacheStatus == flytev1.CacheMiss || ta.Status.CacheStatus == flytev1.CacheSkipped) {
			ta.Status.CacheStatus = s.r.Cache.Store(ctx, ta, info.OutputsURI)
			metrics.CachePut(string(ta.Status.CacheStatus))
		}
		s.terminate(flytev1.PhaseSucceeded, flytev1.ReasonSucceeded, nil)
		return ctrl.Result{}, nil
	case plugin.PhaseRetryableFailure:
		if info.Err != nil && info.Err.Kind == plugin.ErrorKindSystem {
			return s.systemFailure(ctx, p, tCtx, info.Err.Code, info.Err.Message, true)
		}
		return s.userFailure(ctx, p, tCtx, info)
	case plugin.PhasePermanentFailure:
		_ = p.Finalize(ctx, tCtx)
		s.terminate(flytev1.PhaseFailed, or(info.Reason, flytev1.ReasonUserError), toError(info.Err, info.Message))
		return ctrl.Result{}, nil
	default:
		return s.systemFailure(ctx, p, tCtx, "UndefinedPhase", fmt.Sprintf("plugin %s returned phase %s", p.GetID(), info.Phase), false)
	}
	return result, nil
}

// consultCache looks a cacheable action up before its first run: a hit finishes it
// without running anything; a reservation held by an identical action makes it wait.
// It reports whether the pass is over.
func (s *scope) consultCache(ctx context.Context, p plugin.Plugin, tCtx plugin.TaskExecutionContext) (bool, ctrl.Result) {
	ta := s.ta
	switch {
	case !cache.Enabled(ta) || p.GetProperties().DisableNodeLevelCaching:
		ta.Status.CacheStatus = flytev1.CacheDisabled
		return false, ctrl.Result{}
	case s.r.Cache == nil:
		ta.Status.CacheStatus = flytev1.CacheSkipped
		return false, ctrl.Result{}
	case ta.Status.CacheStatus != "":
		if ta.Status.CacheStatus == flytev1.CacheMiss {
			s.r.Cache.Resume(ctx, ta)
		}
		return false, ctrl.Result{}
	}
	d := s.r.Cache.Lookup(ctx, ta, tCtx.OutputWriter().OutputsURI())
	switch {
	case d.Hit:
		metrics.CacheLookedUp("hit")
	case d.Wait > 0:
		metrics.CacheLookedUp("wait")
		metrics.BackedOff(metrics.WaitResources, d.Wait)
	case d.Status == flytev1.CacheSkipped:
		metrics.CacheLookedUp("skipped")
	default:
		metrics.CacheLookedUp("miss")
	}
	switch {
	case d.Hit:
		ta.Status.CacheStatus = flytev1.CacheHit
		ta.Status.OutputsURI = d.OutputsURI
		s.terminate(flytev1.PhaseSucceeded, flytev1.ReasonCacheHit, nil)
		return true, ctrl.Result{}
	case d.Wait > 0:
		s.setPhase(flytev1.PhaseWaitingForResources, flytev1.ReasonWaitingForCache,
			"an identical action is computing the same outputs: "+d.Holder)
		return true, ctrl.Result{RequeueAfter: d.Wait}
	}
	ta.Status.CacheStatus = d.Status
	return false, ctrl.Result{}
}

// userFailure retries a failed attempt as a new one while the action's retries last.
func (s *scope) userFailure(ctx context.Context, p plugin.Plugin, tCtx plugin.TaskExecutionContext, info plugin.PhaseInfo) (ctrl.Result, error) {
	execErr := toError(info.Err, info.Message)
	// Counted, not derived from attempts: a system failure retried in place spends no
	// attempt, so attempts minus system failures would grant it a user retry.
	s.ta.Status.UserFailures++
	if s.ta.Status.UserFailures > s.ta.Spec.Retries {
		_ = p.Finalize(ctx, tCtx)
		s.terminate(flytev1.PhaseFailed, flytev1.ReasonRetriesExhausted, execErr)
		return ctrl.Result{}, nil
	}
	return s.relaunch(ctx, p, tCtx, execErr, s.ta.Status.UserFailures)
}

// systemFailure counts a failure of the platform against its own budget. A failed
// attempt (relaunch) is retried as a new attempt; a failed call into a live attempt is
// retried in place.
func (s *scope) systemFailure(ctx context.Context, p plugin.Plugin, tCtx plugin.TaskExecutionContext, code, message string, relaunch bool) (ctrl.Result, error) {
	s.ta.Status.SystemFailures++
	execErr := &flytev1.ExecutionError{Code: fitText(code, flytev1.MaxErrorCodeLength), Kind: flytev1.ErrorKindSystem, Message: fitText(message, flytev1.MaxErrorMessageLength)}
	s.log.Warn("system failure", "code", code, "message", message, "systemFailures", s.ta.Status.SystemFailures)
	if s.ta.Status.SystemFailures > s.r.Options.MaxSystemFailures {
		s.abortAndFinalize(ctx, p, tCtx)
		s.terminate(flytev1.PhaseFailed, flytev1.ReasonSystemError, execErr)
		return ctrl.Result{}, nil
	}
	if relaunch {
		return s.relaunch(ctx, p, tCtx, execErr, s.ta.Status.SystemFailures)
	}
	s.ta.Status.Error = execErr
	wait := s.r.Options.Backoff.Delay(s.ta.Status.SystemFailures)
	metrics.Retried(metrics.RetrySystem)
	metrics.BackedOff(metrics.RetrySystem, wait)
	next := metav1.NewTime(s.now.Add(wait))
	s.ta.Status.NextAttemptAt = &next
	return ctrl.Result{RequeueAfter: wait}, nil
}

// relaunch ends the current attempt and schedules a new one, with a new number, after a
// backoff that grows with failures (the n-th of its kind).
func (s *scope) relaunch(ctx context.Context, p plugin.Plugin, tCtx plugin.TaskExecutionContext, execErr *flytev1.ExecutionError, n int32) (ctrl.Result, error) {
	if err := p.Finalize(ctx, tCtx); err != nil {
		return ctrl.Result{}, fmt.Errorf("finalizing attempt %d: %w", s.ta.Status.Attempts, err)
	}
	st := &s.ta.Status
	st.Error = execErr
	st.Attempts++
	st.PluginState, st.PluginPhase, st.PluginPhaseVersion = nil, "", 0
	wait := s.r.Options.Backoff.Delay(n)
	kind := metrics.RetryUser
	if execErr.Kind == flytev1.ErrorKindSystem {
		kind = metrics.RetrySystem
	}
	metrics.Retried(kind)
	metrics.BackedOff(kind, wait)
	next := metav1.NewTime(s.now.Add(wait))
	st.NextAttemptAt = &next
	s.setPhase(flytev1.PhaseQueued, flytev1.ReasonRetrying,
		fmt.Sprintf("attempt %d failed (%s: %s); attempt %d starts in %s", st.Attempts-1, execErr.Code, execErr.Message, st.Attempts, wait.Round(time.Millisecond)))
	return ctrl.Result{RequeueAfter: wait}, nil
}

func (s *scope) abortAndFinalize(ctx context.Context, p plugin.Plugin, tCtx plugin.TaskExecutionContext) {
	if err := p.Abort(ctx, tCtx); err != nil {
		s.log.Warn("abort failed", "error", err)
	}
	if err := p.Finalize(ctx, tCtx); err != nil {
		s.log.Warn("finalize failed", "error", err)
	}
}

// attemptStart is when the attempt entered its first phase.
func (s *scope) attemptStart(attempt int32) time.Time {
	for _, h := range s.ta.Status.PhaseHistory {
		if h.Attempt == attempt {
			return h.OccurredAt.Time
		}
	}
	return s.now.Time
}

func (s *scope) setPhase(phase flytev1.Phase, reason, message string) {
	if setPhase(s.ta, phase, reason, message, s.now, s.newVersion, s.logLinks, s.clusterEvents) {
		eventType := corev1.EventTypeNormal
		if phase == flytev1.PhaseFailed || phase == flytev1.PhaseTimedOut || reason == flytev1.ReasonRetrying {
			eventType = corev1.EventTypeWarning
		}
		if s.r.Recorder != nil {
			s.r.Recorder.Event(s.ta, eventType, reason, or(message, string(phase)))
		}
		s.log.Info("phase changed", "phase", phase, "reason", reason, "attempt", s.ta.Status.Attempts)
		metrics.PhaseChanged(string(phase))
	}
}

func (s *scope) terminate(phase flytev1.Phase, reason string, execErr *flytev1.ExecutionError) {
	if phase != flytev1.PhaseSucceeded && s.r.Cache != nil && cache.Enabled(s.ta) {
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

// fail ends an action that cannot run at all; it never got a finalizer.
func (s *scope) fail(reason string, kind flytev1.ErrorKind, message string) {
	if s.ta.Status.Attempts == 0 {
		s.ta.Status.Attempts = 1
	}
	s.terminate(flytev1.PhaseFailed, reason, &flytev1.ExecutionError{Code: reason, Kind: kind, Message: fitText(message, flytev1.MaxErrorMessageLength)})
}

// markTerminal labels a finished action for the garbage collector, drops the finalizer
// (its plugin already finalized) and records the delivery of its events, in one write,
// once the events service has its whole history: the garbage collector must not remove
// an action whose history is not yet recorded elsewhere.
func (s *scope) markTerminal(ctx context.Context) error {
	ta := s.ta
	mark := ""
	if s.r.Events != nil {
		delivered, m := s.r.Events.Delivered(ta)
		if !delivered {
			s.r.Events.Enqueue(ta) // it wakes us when done
			return nil
		}
		mark = m
	}
	if ta.Labels[LabelTerminal] == "true" && !controllerutil.ContainsFinalizer(ta, Finalizer) &&
		(mark == "" || ta.Annotations[flytev1.AnnotationEventsDelivered] == mark) {
		return nil
	}
	// Labels and annotations merge safely with whatever else changed; only dropping a
	// finalizer (the list is replaced as a whole) needs the optimistic lock.
	var patch client.Patch = client.MergeFrom(ta.DeepCopy())
	if controllerutil.ContainsFinalizer(ta, Finalizer) {
		patch = client.MergeFromWithOptions(ta.DeepCopy(), client.MergeFromWithOptimisticLock{})
	}
	if ta.Labels == nil {
		ta.Labels = map[string]string{}
	}
	ta.Labels[LabelTerminal] = "true"
	if mark != "" {
		if ta.Annotations == nil {
			ta.Annotations = map[string]string{}
		}
		ta.Annotations[flytev1.AnnotationEventsDelivered] = mark
	}
	controllerutil.RemoveFinalizer(ta, Finalizer)
	if err := s.r.Client.Patch(ctx, ta, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("labeling finished action: %w", err)
	}
	return nil
}

// reconcileDelete aborts and finalizes a deleted action's attempt, records it Aborted
// and, once the events service has heard of it, lets the action go.
func (s *scope) reconcileDelete(ctx context.Context) error {
	ta := s.ta
	if !controllerutil.ContainsFinalizer(ta, Finalizer) {
		return nil
	}
	if !ta.Status.Phase.IsTerminal() {
		if p, err := s.resolve(ta.Spec.TaskType); err == nil {
			tCtx := s.executionContext(max(ta.Status.Attempts, 1))
			if err := p.Abort(ctx, tCtx); err != nil {
				return fmt.Errorf("aborting: %w", err)
			}
			if err := p.Finalize(ctx, tCtx); err != nil {
				return fmt.Errorf("finalizing: %w", err)
			}
		}
		s.terminate(flytev1.PhaseAborted, flytev1.ReasonAborted, nil)
		if err := s.writeStatus(ctx); err != nil {
			return err
		}
	}
	if s.r.Events != nil {
		if delivered, _ := s.r.Events.Delivered(ta); !delivered {
			s.r.Events.Enqueue(ta) // it wakes us when done
			return nil
		}
	}
	patch := client.MergeFrom(ta.DeepCopy())
	controllerutil.RemoveFinalizer(ta, Finalizer)
	if err := s.r.Client.Patch(ctx, ta, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	return nil
}

// validate checks what the CRD schema cannot: that URIs parse.
func validate(ta *flytev1.TaskAction) string {
	for field, v := range map[string]string{"spec.inputUri": ta.Spec.InputURI, "spec.runOutputBase": ta.Spec.RunOutputBase} {
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || u.Scheme == "" {
			return fmt.Sprintf("%s: %q is not a URI such as s3://bucket/path", field, v)
		}
	}
	return ""
}

func toError(e *plugin.ExecutionError, message string) *flytev1.ExecutionError {
	if e == nil {
		return &flytev1.ExecutionError{Code: "Unknown", Kind: flytev1.ErrorKindUser, Message: fitText(message, flytev1.MaxErrorMessageLength)}
	}
	kind := flytev1.ErrorKindUser
	if e.Kind == plugin.ErrorKindSystem {
		kind = flytev1.ErrorKindSystem
	}
	return &flytev1.ExecutionError{Code: fitText(e.Code, flytev1.MaxErrorCodeLength), Kind: kind, Message: fitText(e.Message, flytev1.MaxErrorMessageLength)}
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// uidIndex indexes the cached actions by UID.
const uidIndex = "metadata.uid"

// actionOf maps an object a plugin created to its action: the owner reference's target,
// or the cached action whose UID the object's labels name.
func (r *TaskActionReconciler) actionOf(ctx context.Context, obj client.Object) []reconcile.Request {
	if ref := metav1.GetControllerOf(obj); ref != nil {
		if ref.Kind == "TaskAction" && strings.HasPrefix(ref.APIVersion, flytev1.GroupVersion.Group+"/") {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
		}
		return nil
	}
	uid := obj.GetLabels()[plugin.LabelTaskActionUID]
	if uid == "" {
		return nil
	}
	var actions flytev1.TaskActionList
	if err := r.Client.List(ctx, &actions, client.InNamespace(obj.GetNamespace()), client.MatchingFields{uidIndex: uid}); err != nil {
		r.Log.ErrorContext(ctx, "finding the action of an object", "object", client.ObjectKeyFromObject(obj), "error", err)
		return nil
	}
	var reqs []reconcile.Request
	for _, a := range actions.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&a)})
	}
	return reqs
}

// SetupWithManager registers the reconciler. Only changes of the spec or of deletion
// (both bump the generation) and explicit requeues wake it: its own status writes do not.
func (r *TaskActionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Events != nil {
		b = b.WatchesRawSource(r.Events.Source())
	}
	// Objects that plugins create (pods, jobs) wake their action when they change: the
	// action is found by the object's owner reference or, for objects that cannot be
	// owned, by the action's UID in its labels.
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &flytev1.TaskAction{}, uidIndex,
		func(o client.Object) []string { return []string{string(o.GetUID())} }); err != nil {
		return fmt.Errorf("indexing actions by UID: %w", err)
	}
	watched := map[string]bool{}
	for _, p := range r.Registry.Plugins() {
		w, ok := p.(interface{ ResourceToWatch() client.Object })
		if !ok || w.ResourceToWatch() == nil {
			continue
		}
		obj := w.ResourceToWatch()
		if key := fmt.Sprintf("%T", obj); !watched[key] {
			watched[key] = true
			b = b.Watches(obj, handler.EnqueueRequestsFromMapFunc(r.actionOf))
		}
	}
	return b.
		For(&flytev1.TaskAction{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("taskaction").
		WithOptions(controller.Options{
			// Failed passes (transient API errors, conflicts) are retried with a jittered
			// backoff capped like the retries of attempts, not controller-runtime's 16
			// minutes without jitter.
			RateLimiter: newTransientLimiter(Backoff{Base: transientRetryBase,
				Cap: max(r.Options.Backoff.Cap, transientRetryBase), Rand: rand.Float64}),
			MaxConcurrentReconciles: max(r.Options.MaxConcurrentReconciles, 1),
			SkipNameValidation:      &r.Options.SkipNameValidation,
		}).
		Complete(r)
}
