package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// scope is one reconcile of one action: what the steps of a pass share.
type scope struct {
	r      *TaskActionReconciler
	ta     *flytev1.TaskAction
	before *flytev1.TaskActionStatus // as last written
	log    *slog.Logger
	now    metav1.Time
	// span is the reconcile's span.
	span trace.Span

	// plugin runs the action's task type, tCtx its current attempt; set by the first
	// steps of a pass.
	plugin core.Plugin
	tCtx   core.TaskExecutionContext
	// info is what the plugin's Handle reported in this pass, and result when the pass
	// should run again if nothing else wakes it.
	info   core.PhaseInfo
	result ctrl.Result
	// newVersion: the plugin reported a new version of its phase in this pass.
	newVersion bool
	// logLinks and clusterEvents are what the plugin reported in this pass.
	logLinks      []flytev1.LogLink
	clusterEvents []flytev1.ClusterEvent
}

// reconcile is one pass over the action. Whatever the pass changed in the status is
// written once, at its end.
//
// The history is the only durable copy of the action's events until they are
// delivered, so the action holds the finalizer from before its first entry is written
// until its last is delivered: a deletion then waits for the delivery (and records
// Aborted) whatever happens to this executor meanwhile. An action without events to
// keep (no events service) holds it only while it runs, to be aborted.
func (s *scope) reconcile(ctx context.Context) (ctrl.Result, error) {
	switch {
	case !s.ta.DeletionTimestamp.IsZero():
		return ctrl.Result{}, s.reconcileDelete(ctx)
	case s.ta.Status.Phase.IsTerminal():
		return ctrl.Result{}, s.releaseWhenDelivered(ctx)
	}
	// An executor that took over (a new leader, a restart) knows nothing of what its
	// predecessor wrote but did not deliver: hand it over now, not at the action's next
	// change of phase, which may be hours away.
	s.handOver()
	result, err := s.reconcileActive(ctx)
	guard := s.writesHistory() && (s.r.Events != nil || !s.ta.Status.Phase.IsTerminal())
	if guard && !controllerutil.ContainsFinalizer(s.ta, Finalizer) {
		// Nothing of this pass is written without it; the pass is done again.
		if ferr := s.addFinalizer(ctx); ferr != nil {
			return ctrl.Result{}, errors.Join(err, ferr)
		}
	}
	if werr := s.writeStatus(ctx, err == nil); werr != nil {
		return ctrl.Result{}, errors.Join(err, werr)
	}
	if s.ta.Status.Phase.IsTerminal() {
		return ctrl.Result{}, errors.Join(err, s.releaseWhenDelivered(ctx))
	}
	return result, err
}

// writesHistory says this pass has history to write: a new last entry.
func (s *scope) writesHistory() bool {
	now, _ := lastEntry(&s.ta.Status)
	was, _ := lastEntry(s.before)
	return now != was
}

// releaseWhenDelivered takes the finalizer off a finished action once its history is
// delivered; until then the event sink wakes the action when it is. A finished action
// is reached again only when something wakes it: that delivery, a restart (after which
// the sink knows nothing of it, and so delivers its history again before the garbage
// collector may delete it), its pod going away.
func (s *scope) releaseWhenDelivered(ctx context.Context) error {
	if s.r.Events != nil && !s.r.Events.ReleaseWhenDelivered(s.ta) {
		return nil
	}
	return s.removeFinalizer(ctx)
}

// handOver gives the event sink the action's history as found, unless it is delivered.
func (s *scope) handOver() {
	if s.r.Events != nil && !s.r.Events.Delivered(s.ta) {
		s.r.Events.Enqueue(s.ta)
	}
}

// reconcileDelete aborts and finalizes a deleted action's attempt, records it Aborted
// and, once the events service has heard of it, lets the action go. An action without
// the finalizer (one that finished, or never ran past its first pass) goes at once.
func (s *scope) reconcileDelete(ctx context.Context) error {
	ta := s.ta
	if !controllerutil.ContainsFinalizer(ta, Finalizer) {
		return nil
	}
	if !ta.Status.Phase.IsTerminal() {
		if p, err := s.resolve(ta.Spec.TaskType); err == nil { // no plugin: nothing to abort
			s.plugin, s.tCtx = p, s.executionContext(max(ta.Status.Attempts, 1))
			// The finalizer is there for this: the pass is retried until the plugin has
			// let go of what it created.
			if _, err := s.release(ctx, true); err != nil {
				return err
			}
		}
		s.terminate(flytev1.PhaseAborted, flytev1.ReasonAborted, nil)
		if err := s.writeStatus(ctx, true); err != nil {
			return err
		}
	}
	if s.r.Events != nil && !s.r.Events.ReleaseWhenDelivered(ta) {
		return nil // the sink wakes us when it is delivered
	}
	return s.removeFinalizer(ctx)
}

// writeStatus writes the status if this pass changed it, and hands new history to the
// event sink. The observed generation moves only with a pass that succeeded.
func (s *scope) writeStatus(ctx context.Context, passSucceeded bool) error {
	if passSucceeded {
		s.ta.Status.ObservedGeneration = s.ta.Generation
	}
	if equality.Semantic.DeepEqual(s.before, &s.ta.Status) {
		return nil
	}
	if err := s.r.Client.Status().Update(ctx, s.ta); err != nil {
		// A conflict means someone wrote meanwhile; Handle is idempotent, so the next
		// reconcile simply does this step again.
		return fmt.Errorf("updating status: %w", err)
	}
	// New history is a new last entry: a folded repeat changes its version, not the
	// history's length.
	now, _ := lastEntry(&s.ta.Status)
	if was, _ := lastEntry(s.before); now != was {
		s.r.expectations().expect(s.ta)
		s.settleExpectation(ctx)
		if s.r.Events != nil {
			s.r.Events.Enqueue(s.ta)
		}
	}
	s.before = s.ta.Status.DeepCopy()
	return nil
}

// addFinalizer adds the finalizer with a patch of the metadata alone. An update would
// send the whole object back as the Go types spell it ("0.5" CPUs as "500m", "90s" as
// "1m30s", an absent section as an empty one), which the CRD's immutable-spec rule
// refuses for an action written by hand.
func (s *scope) addFinalizer(ctx context.Context) error {
	return s.patchFinalizer(ctx, controllerutil.AddFinalizer, "adding finalizer")
}

// removeFinalizer takes the finalizer off, if it is there.
func (s *scope) removeFinalizer(ctx context.Context) error {
	if !controllerutil.ContainsFinalizer(s.ta, Finalizer) {
		return nil
	}
	err := s.patchFinalizer(ctx, controllerutil.RemoveFinalizer, "removing finalizer")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// patchFinalizer changes the finalizers with a merge patch under the optimistic lock
// (the list is replaced as a whole), keeping this pass's status.
func (s *scope) patchFinalizer(ctx context.Context, change func(client.Object, string) bool, what string) error {
	status := s.ta.Status.DeepCopy()
	patch := client.MergeFromWithOptions(s.ta.DeepCopy(), client.MergeFromWithOptimisticLock{})
	change(s.ta, Finalizer)
	err := s.r.Client.Patch(ctx, s.ta, patch)
	s.ta.Status = *status // the patch returned the stored status; keep ours
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// A pass woken before the informer shows this (by the pod going away, say) would
	// patch again from the older copy and be refused.
	s.r.expectations().expectFinalizer(s.ta)
	s.settleExpectation(ctx)
	return nil
}

// settleExpectation checks the cache once right after a write: the informer may have
// shown it before it was expected, and then nothing would end the expectation of an
// action that no pass sees again.
func (s *scope) settleExpectation(ctx context.Context) {
	var cached flytev1.TaskAction
	if err := s.r.Client.Get(ctx, client.ObjectKeyFromObject(s.ta), &cached, client.UnsafeDisableDeepCopy); err == nil && cached.UID == s.ta.UID {
		s.r.expectations().stale(&cached)
	}
}

func (s *scope) executionContext(attempt int32) core.TaskExecutionContext {
	return core.NewTaskExecutionContext(core.ExecutionContextOptions{
		Action: s.ta, Attempt: attempt, DefaultServiceAccount: s.r.Options.DefaultServiceAccount,
		DataStore: s.r.DataStore, Secrets: s.r.Client, SecretsNamespace: s.r.Options.ExecutorNamespace, Clock: s.r.Clock.Now,
		Interruptible: s.interruptible(),
	})
}

// interruptible is the policy that places the attempts of interruptible actions.
func (s *scope) interruptible() core.InterruptiblePolicy {
	return core.InterruptiblePolicy{FailureThreshold: s.r.Options.InterruptibleFailureThreshold, MaxSystemFailures: s.r.Options.MaxSystemFailures}
}

// onDemand says, for the history of the attempt about to start, why an interruptible
// action runs it on on-demand capacity; empty when it does not. It counts the system
// failures the attempt's pod will be placed by, as the plugin's metadata does.
func (s *scope) onDemand() string {
	_, why := s.interruptible().Decide(s.ta)
	return why
}
