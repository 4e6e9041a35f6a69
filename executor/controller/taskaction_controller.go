// Package controller reconciles TaskAction resources: it drives each action's plugin
// through attempts, retries user and system failures against separate budgets with
// backoff, enforces timeouts, and runs Abort and Finalize when an action is deleted.
package controller

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/fairqueue"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/storage"
	"github.com/flytekube/backend/executor/tenancy"
	"github.com/flytekube/backend/executor/tracing"
	"github.com/flytekube/backend/internal/backoff"
)

// staleCacheWait is how long a reconcile that found the cache behind our own write waits
// before looking again.
const staleCacheWait = 50 * time.Millisecond

// transientRetryBase is the first wait before a pass that failed on a transient error
// runs again; it doubles with each failure in a row.
const transientRetryBase = 100 * time.Millisecond

// Finalizer keeps a deleted action until its plugin has aborted and finalized and its
// Aborted phase is delivered. With an events service an action carries it from before
// its first history entry is written until its last is delivered; without one, only
// while it runs.
const Finalizer = "flyte.org/plugin-finalizer"

// Options tune the reconciler.
type Options struct {
	// DefaultServiceAccount applies to actions that name none.
	DefaultServiceAccount string
	// ExecutorNamespace is where plugins' SecretManager reads; empty: nowhere.
	ExecutorNamespace string
	// MaxSystemFailures is how many system failures an action survives.
	MaxSystemFailures int32
	// InterruptibleFailureThreshold moves interruptible actions to on-demand capacity
	// after that many system failures (negative: maxSystemFailures less that many);
	// 0 never does (see core.InterruptiblePolicy).
	InterruptibleFailureThreshold int32
	// Backoff spaces attempts. Its base must be positive: a step that backs off ends the
	// pass only by the wait it returns, which a zero wait would not (see step).
	Backoff backoff.Backoff
	// MaxConcurrentReconciles is the number of workers.
	MaxConcurrentReconciles int
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
	// QueueWeights weighs namespaces in the work queue (default 1 each).
	QueueWeights map[string]int
	// QueueMetrics records the work queue's depth and wait by namespace; nil records
	// nothing.
	QueueMetrics *fairqueue.Metrics
	// NewQueue makes the controller's work queue (controller-runtime's
	// controller.Options.NewQueue); nil makes the queue fair across namespaces
	// (NamespaceFairQueue with QueueWeights and QueueMetrics).
	NewQueue func(controllerName string, rateLimiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request]
	// WrapReconciler, when set, is given the reconciler and returns what the controller
	// calls instead, which must call it for each request: a middleware that observes,
	// times or delays passes, costing nothing when unset.
	WrapReconciler func(reconcile.Reconciler) reconcile.Reconciler
	// Tenancy ties actions' projects to their namespaces; the zero value is
	// tenancy.Default(). There is no way to turn it off.
	Tenancy tenancy.Rule
}

func (o Options) tenancy() tenancy.Rule {
	if o.Tenancy == (tenancy.Rule{}) {
		return tenancy.Default()
	}
	return o.Tenancy
}

// EventSink delivers the phase history the reconciler writes to the events service; a
// nil sink turns events off. It alone knows what has been delivered.
type EventSink interface {
	// Enqueue hands over ta as just written (or found, after a restart) for its
	// undelivered history to be delivered; handing over what is delivered or already
	// waiting does nothing.
	Enqueue(ta *flytev1.TaskAction)
	// Delivered reports whether all of ta's history was delivered.
	Delivered(ta *flytev1.TaskAction) bool
	// ReleaseWhenDelivered reports whether all of a finished (or deleted) action's
	// history was delivered; if not, it hands ta over and Source wakes the reconciler
	// once it is.
	ReleaseWhenDelivered(ta *flytev1.TaskAction) bool
	// Forget is told that an action is gone.
	Forget(types.NamespacedName)
	// Source wakes the reconciler when a deleted action's history has been delivered.
	Source() source.Source
}

// Cache memoizes cacheable actions' outputs (cacheclient.Cache, whose heartbeats and
// releases run as a manager.Runnable of their own); a nil cache turns caching off.
type Cache interface {
	// Lookup consults the cache before an action's first run: a hit, a miss (holding the
	// reservation of a serializable action), or whom to wait for.
	Lookup(ctx context.Context, ta *flytev1.TaskAction, outputsURI string) cacheclient.Decision
	// Resume makes sure a running serializable action's reservation is held, as after a
	// restart.
	Resume(ctx context.Context, ta *flytev1.TaskAction)
	// Store puts a succeeded action's outputs in the cache, releasing its reservation,
	// and returns the cache status to report.
	Store(ctx context.Context, ta *flytev1.TaskAction, outputsURI string) flytev1.CacheStatus
	// Release gives up the action's reservation, if it holds one.
	Release(ctx context.Context, ta *flytev1.TaskAction)
	// Gone is told that an action no longer exists (from the informer's delete handler);
	// it must not wait on the cache service.
	Gone(uid types.UID)
}

// Backlog bounds the finished actions whose history waits for the events service: at
// its bound, actions that have not started wait (backlog.Gate).
type Backlog interface {
	// Admit reports whether the action, which has not started, may start; if so, Release
	// is called when the pass ends. If not, the action is held, and its key is queued
	// again (through Source) when there is room.
	Admit(key types.NamespacedName, uid types.UID) bool
	Release()
	// Finished is told of each finished status written.
	Finished(ta *flytev1.TaskAction)
	// Bound is the number of finished, undelivered actions at which new ones wait.
	Bound() int
	// Source counts the backlog before the first reconcile and wakes held actions.
	Source() source.TypedSource[reconcile.Request]
}

// TaskActionReconciler reconciles TaskActions.
type TaskActionReconciler struct {
	Client    client.Client
	Registry  *core.Registry
	DataStore storage.DataStore
	Recorder  record.EventRecorder
	Clock     clock.PassiveClock
	Log       *slog.Logger
	Events    EventSink
	// Backlog holds new actions while too much finished history waits for the events
	// service; nil starts every action.
	Backlog Backlog
	// Metrics records what the reconciler does; nil records nothing.
	Metrics *metrics.Metrics
	// Cache memoizes outputs of cacheable actions; nil turns caching off.
	Cache   Cache
	Options Options
	// TracerProvider receives the spans of reconciles and plugin calls; nil means the
	// global one.
	TracerProvider trace.TracerProvider

	tracerOnce sync.Once
	tr         trace.Tracer

	// written is what this process wrote and the informer cache has not shown yet.
	writtenOnce sync.Once
	written     *expectations
}

func (r *TaskActionReconciler) expectations() *expectations {
	r.writtenOnce.Do(func() { r.written = newExpectations() })
	return r.written
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

// Reconcile runs one pass over one action (scope.reconcile), once the informer cache
// shows what this process last wrote of it.
func (r *TaskActionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ta flytev1.TaskAction
	if err := r.Client.Get(ctx, req.NamespacedName, &ta); err != nil {
		if apierrors.IsNotFound(err) && r.Events != nil {
			r.Events.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.expectations().stale(&ta) {
		return ctrl.Result{RequeueAfter: staleCacheWait}, nil
	}
	// Every reconcile of the action is a span of the action's one trace (see tracing).
	ctx, span := r.tracer().Start(tracing.ContextWithAction(ctx, ta.UID), "TaskAction.Reconcile")
	log := r.Log.With("namespace", ta.Namespace, "taskAction", ta.Name, "project", ta.Spec.Project,
		"domain", ta.Spec.Domain, "run", ta.Spec.RunName, "action", ta.Spec.ActionName)
	s := &scope{r: r, ta: &ta, log: log, now: metav1.NewTime(r.Clock.Now()), before: ta.Status.DeepCopy(), span: span}
	started := time.Now()
	result, err := s.reconcile(ctx)
	r.Metrics.Reconciled(time.Since(started), resultLabel(result, err))
	if span.IsRecording() { // attributes cost allocations; not when tracing is off
		span.SetAttributes(tracing.ActionAttributes(&ta)...)
	}
	end(span, err)
	return result, err
}

// gone lets go of what is held for a deleted action: a reservation it heartbeats.
func (r *TaskActionReconciler) gone(uid types.UID) {
	if r.Cache != nil {
		r.Cache.Gone(uid)
	}
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

// uidIndex indexes the cached actions by UID.
const uidIndex = "metadata.uid"

// newQueue returns what makes the controller's work queue: Options.NewQueue, else fair
// across namespaces.
func (r *TaskActionReconciler) newQueue() func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	if r.Options.NewQueue != nil {
		return r.Options.NewQueue
	}
	weights := r.Options.QueueWeights
	return NamespaceFairQueue(fairqueue.Options[reconcile.Request]{
		Weight:  func(namespace string) int { return weights[namespace] },
		Metrics: r.Options.QueueMetrics,
	})
}

// NamespaceFairQueue makes work queues (as Options.NewQueue) that serve namespaces in
// turn (fairqueue), each request the tenant of its namespace, with the controller's rate
// limiter: the controller's queue when Options.NewQueue is nil, built with other options
// (such as PromoteAfter) by whoever wants it so.
func NamespaceFairQueue(opts fairqueue.Options[reconcile.Request]) func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return func(_ string, limiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		o := opts
		o.TenantOf = func(req reconcile.Request) string { return req.Namespace }
		o.RateLimiter = limiter
		return fairqueue.New(o)
	}
}

// actionOf maps an object a plugin created to its action: the owner reference's target,
// or the cached action whose UID the object's labels name.
func (r *TaskActionReconciler) actionOf(ctx context.Context, obj client.Object) []reconcile.Request {
	if ref := metav1.GetControllerOf(obj); ref != nil {
		if ref.Kind == "TaskAction" && strings.HasPrefix(ref.APIVersion, flytev1.GroupVersion.Group+"/") {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
		}
		return nil
	}
	uid := obj.GetLabels()[core.LabelTaskActionUID]
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
	if r.Backlog != nil {
		b = b.WatchesRawSource(r.Backlog.Source())
	}
	// Objects that plugins create (pods, jobs) wake their action when they change: the
	// action is found by the object's owner reference or, for objects that cannot be
	// owned, by the action's UID in its labels.
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &flytev1.TaskAction{}, uidIndex,
		func(o client.Object) []string { return []string{string(o.GetUID())} }); err != nil {
		return fmt.Errorf("indexing actions by UID: %w", err)
	}
	// What the reconciler holds per action ends with the action: the informer's deletion
	// ends it even for an action no pass sees again (one deleted without its finalizer).
	informer, err := mgr.GetCache().GetInformer(context.Background(), &flytev1.TaskAction{})
	if err != nil {
		return fmt.Errorf("getting the actions' informer: %w", err)
	}
	if _, err := informer.AddEventHandler(r.expectations().informerHandler(r.gone)); err != nil {
		return fmt.Errorf("watching actions' deletions: %w", err)
	}
	// The same kinds whose informers the manager's cache restricts to managed objects.
	for _, obj := range r.Registry.Watches() {
		b = b.Watches(obj, handler.EnqueueRequestsFromMapFunc(r.actionOf))
	}
	var called reconcile.Reconciler = r
	if r.Options.WrapReconciler != nil {
		called = r.Options.WrapReconciler(r)
	}
	return b.
		For(&flytev1.TaskAction{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("taskaction").
		WithOptions(controller.Options{
			// Failed passes (transient API errors, conflicts) are retried with a jittered
			// backoff capped like the retries of attempts, not controller-runtime's 16
			// minutes without jitter; per action, from its failures in a row, which a
			// successful pass resets. Being the queue's, these waits cost no status write:
			// a write per throttled call would add load to the API server that is
			// throttling. They show in flyte_executor_retries_total{kind="transient"}.
			RateLimiter: backoff.NewLimiter[reconcile.Request](backoff.Backoff{Base: transientRetryBase,
				Cap: max(r.Options.Backoff.Cap, transientRetryBase)}),
			MaxConcurrentReconciles: max(r.Options.MaxConcurrentReconciles, 1),
			SkipNameValidation:      &r.Options.SkipNameValidation,
			// Namespaces are served in turn, so that one's backlog does not hold up
			// another's actions (controller-runtime's queue is first in, first out).
			NewQueue: r.newQueue(),
		}).
		Complete(called)
}
