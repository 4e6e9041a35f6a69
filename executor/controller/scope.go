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
	// info is what the plugin's Handle reported in this pass.
	info core.PhaseInfo
	// newVersion: the plugin reported a new version of its phase in this pass.
	newVersion bool
	// logLinks and clusterEvents are what the plugin reported in this pass.
	logLinks      []flytev1.LogLink
	clusterEvents []flytev1.ClusterEvent
	// admitted: the backlog let the action start in this pass (Release at its end);
	// held: it did not, and the pass ends.
	admitted, held bool
}

// reconcile is one pass over the action, in the shape of cluster-api's controllers:
//
//   - a live action that will need the finalizer and lacks it gets it first, alone, and
//     the pass returns (ensureFinalizer, the first step of reconcileActive); one whose
//     need only the end of the pass shows gets it right before its status (closePass);
//   - otherwise a live action is advanced (reconcileActive), a deleted one aborted
//     (reconcileDelete), and a finished one left as it is;
//   - closePass, deferred, ends every pass: it writes what the pass changed in the status,
//     once, then lets a finished action go once its history is delivered. No step writes
//     the status itself.
//
// The history is the only durable copy of the action's events until they are
// delivered, so with an events service the action holds the finalizer from before its
// first entry is written until its last is delivered: a deletion then waits for the
// delivery (and records Aborted) whatever happens to this executor meanwhile. An action
// without events to keep (no events service) holds it only while it runs, to be aborted
// (needsFinalizer).
func (s *scope) reconcile(ctx context.Context) (result ctrl.Result, err error) {
	deleted := !s.ta.DeletionTimestamp.IsZero()
	if deleted && !s.holdsFinalizer() {
		// Let go already, or deleted before a pass put the finalizer on: nothing to abort,
		// nothing to keep.
		return ctrl.Result{}, nil
	}
	defer func() {
		result, err = s.closePass(ctx, result, err)
		if s.admitted {
			s.r.Backlog.Release() // after the status, whose finish it counts
		}
	}()
	// Conditions an executor of v0.2.0 left behind are put right, finished or not;
	// closePass writes them, and nothing when they were right.
	restateConditions(s.ta)
	switch {
	case s.ta.Status.Phase.IsTerminal():
		return ctrl.Result{}, nil // its status is final; closePass lets it go
	case deleted:
		return ctrl.Result{}, s.reconcileDelete(ctx)
	}
	// An executor that took over (a new leader, a restart) knows nothing of what its
	// predecessor wrote but did not deliver: hand it over now, not at the action's next
	// change of phase, which may be hours away.
	s.handOver()
	return s.reconcileActive(ctx)
}

// closePass ends every pass over an action this executor still holds or runs: it writes
// what the pass changed in the status, in one write, then lets a finished action go once
// its history is delivered.
//
// A pass may find only at its end that the action needs the finalizer: without an events
// service, the action of an in-process plugin (core-sleep) needs it only if the pass
// leaves it running, which only the plugin's Handle tells. Then the finalizer goes on
// right before the status that needs it. Ending the pass there to do it again under the
// finalizer, as ensureFinalizer does, would run it twice: a second Handle, and its phase
// changes, retries and Warning events counted and recorded twice.
func (s *scope) closePass(ctx context.Context, result ctrl.Result, err error) (ctrl.Result, error) {
	if s.writesHistory() && !s.holdsFinalizer() && s.needsFinalizer() {
		if ferr := s.addFinalizer(ctx); ferr != nil {
			return ctrl.Result{}, errors.Join(err, ferr) // nothing of the pass is written without it
		}
	}
	if werr := s.writeStatus(ctx, err == nil); werr != nil {
		return ctrl.Result{}, errors.Join(err, werr)
	}
	if s.ta.Status.Phase.IsTerminal() {
		return result, errors.Join(err, s.releaseWhenDelivered(ctx))
	}
	return result, err
}

// needsFinalizer says whether the action, as this pass has it, must hold the finalizer.
// With an events service, always: its history is guarded from before its first entry.
// Without one, while it runs: from before the first Handle of a plugin that creates
// things outside the action (a pod), so that deleting the action always aborts them,
// and, for an in-process plugin, once a pass leaves it unfinished (closePass). An action
// that fails before it runs (an unknown task type, an invalid spec) never needs it then.
func (s *scope) needsFinalizer() bool {
	switch {
	case s.r.Events != nil:
		return true
	case s.ta.Status.Phase.IsTerminal():
		return false
	case len(s.ta.Status.PhaseHistory) > 0:
		return true // it runs
	}
	p, err := s.resolve(s.ta.Spec.TaskType)
	return err == nil && p.GetProperties().NeedsFinalizer && s.specError() == ""
}

func (s *scope) holdsFinalizer() bool { return controllerutil.ContainsFinalizer(s.ta, Finalizer) }

// writesHistory says this pass has history to write: a new last entry.
func (s *scope) writesHistory() bool {
	now, _ := s.ta.Status.PhaseHistory.Last()
	was, _ := s.before.PhaseHistory.Last()
	return now.Mark() != was.Mark()
}

// releaseWhenDelivered is the one place the finalizer comes off: a finished action (its
// outcome written, or, deleted, its Aborted) is let go once its history is delivered;
// until then the event sink wakes the action when it is. A finished action is reached
// again only when something wakes it: that delivery, a restart (after which the sink
// knows nothing of it, and so delivers its history again before the garbage collector
// may delete it), its pod going away.
func (s *scope) releaseWhenDelivered(ctx context.Context) error {
	if s.r.Events != nil && !s.r.Events.ReleaseWhenDelivered(s.ta) {
		return nil
	}
	if !s.holdsFinalizer() {
		return nil
	}
	err := s.patchFinalizer(ctx, controllerutil.RemoveFinalizer, "removing finalizer")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// handOver gives the event sink the action's history as found, unless it is delivered.
func (s *scope) handOver() {
	if s.r.Events != nil && !s.r.Events.Delivered(s.ta) {
		s.r.Events.Enqueue(s.ta)
	}
}

// reconcileDelete aborts and finalizes a deleted action's attempt and records it
// Aborted; closePass writes that and lets the action go once the events service has it.
// The finalizer is there for this: the pass is retried until the plugin has let go of
// what it created.
func (s *scope) reconcileDelete(ctx context.Context) error {
	if p, err := s.resolve(s.ta.Spec.TaskType); err == nil { // no plugin: nothing to abort
		s.plugin, s.tCtx = p, s.executionContext(max(s.ta.Status.Attempts, 1))
		if _, err := s.release(ctx, true); err != nil {
			return err
		}
	}
	s.terminate(flytev1.PhaseAborted, flytev1.ReasonAborted, nil)
	return nil
}

// writeStatus writes the status if the pass changed it, and hands new history to the
// event sink; closePass alone calls it. The observed generation moves only with a pass
// that succeeded, and only in a write the pass makes anyway: the spec is immutable, so
// the generation moves only with a deletion, whose pass writes Aborted, and a pass that
// changed nothing else (a finished action's, one that only put the finalizer on) writes
// nothing.
func (s *scope) writeStatus(ctx context.Context, passSucceeded bool) error {
	if equality.Semantic.DeepEqual(s.before, &s.ta.Status) {
		return nil
	}
	if passSucceeded {
		s.ta.Status.ObservedGeneration = s.ta.Generation
	}
	// An Update, not a merge patch: it carries the resourceVersion read, so a write from a
	// stale copy or by another writer is refused instead of replacing the history (a list,
	// replaced whole by a merge patch); a patch under the same lock measured no cheaper
	// (docs/benchmarks.md, "The status write: update or patch").
	if err := s.r.Client.Status().Update(ctx, s.ta); err != nil {
		// A conflict means someone wrote meanwhile; Handle is idempotent, so the next
		// reconcile simply does this pass again.
		return fmt.Errorf("updating status: %w", err)
	}
	if s.r.Backlog != nil && s.ta.Status.Phase.IsTerminal() {
		s.r.Backlog.Finished(s.ta) // before the sink can deliver it
	}
	// New history is a new last entry: a folded repeat changes its version, not the
	// history's length.
	if s.writesHistory() {
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
