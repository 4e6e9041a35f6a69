package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"golang.org/x/time/rate"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/internal/backoff"
)

// GarbageCollector deletes finished TaskActions, so that the API server holds the work
// and not its record (the events service keeps that): each one a short MaxTTL after it
// finished, and, over a bound on finished actions held (per namespace and in all), the
// oldest first, however recent. An action whose history is not yet delivered is never
// deleted. It collects continuously, every Interval, its deletes spread at
// DeletesPerSecond rather than in bursts that would crowd out the reconciler's writes.
// An action the API server refuses to delete (a webhook, a policy, RBAC) is skipped,
// counted and reported, and tried again after a backoff, while the others go as before.
// It is a manager runnable that only the leader runs. It walks the actions the informer
// cache already holds and picks the finished ones by their status, so collecting costs
// the API server nothing but the deletes. Make one with NewGarbageCollector.
type GarbageCollector struct {
	// reader lists the actions: the manager's informer cache; writer deletes.
	reader client.Reader
	writer client.Writer
	opts   GarbageCollectorOptions

	// limiter spreads the deletes at DeletesPerSecond; nil when they are not spread.
	limiter *rate.Limiter
	// refused holds the actions whose last delete the API server refused, by UID, until
	// they go or are no longer finished and held.
	refused map[types.UID]*refusal
	// refusalLog spaces the log lines about refusals; the counts go in the metrics.
	refusalLog *rate.Limiter
	unlogged   int
}

// GarbageCollectorOptions are what a GarbageCollector needs beside where it reads the
// actions and where it deletes them.
type GarbageCollectorOptions struct {
	// Delivered reports whether an action's whole history is recorded by the events
	// service; an action whose history is not is kept. Nil when events are off: every
	// action counts as delivered.
	Delivered func(*flytev1.TaskAction) bool
	// Interval is how often Start collects; MaxTTL how long a finished action is kept.
	Interval, MaxTTL time.Duration
	// MaxFinished and MaxFinishedPerNamespace bound the finished actions held; 0 is no
	// bound.
	MaxFinished, MaxFinishedPerNamespace int
	// DeletesPerSecond spreads the deletes; 0 does not. One pass deletes at most what
	// this rate allows in an Interval, so that the next pass, on a fresher walk, picks
	// what goes next.
	DeletesPerSecond float64
	// Clock says when actions expire; nil is the real clock.
	Clock clock.PassiveClock
	// Log is where the collector says what it did; nil logs nothing.
	Log *slog.Logger
	// Metrics records each collection; nil records nothing.
	Metrics *metrics.Metrics
	// Recorder, when set, puts a Warning Event (DeleteRefused) on each action the API
	// server refuses to delete.
	Recorder record.EventRecorder
}

// NewGarbageCollector makes a collector that lists the actions from reader (the
// manager's informer cache) and deletes them with writer.
func NewGarbageCollector(reader client.Reader, writer client.Writer, opts GarbageCollectorOptions) *GarbageCollector {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	g := &GarbageCollector{reader: reader, writer: writer, opts: opts}
	if opts.DeletesPerSecond > 0 {
		g.limiter = rate.NewLimiter(rate.Limit(opts.DeletesPerSecond), 1)
	}
	return g
}

// ReasonDeleteRefused is the reason of the Warning Event on an action the collector
// could not delete.
const ReasonDeleteRefused = "DeleteRefused"

// refusal is an action the API server refused to delete: tried again at retryAt.
type refusal struct {
	failures int32
	retryAt  time.Time
}

// refusalBackoff spaces the tries to delete an action the API server refused: one to
// two passes at first, doubling up to an hour (or two passes if longer), so that a
// refused action does not spend every pass's delete budget and is still tried again
// should the refusal end.
func (g *GarbageCollector) refusalBackoff() backoff.Backoff {
	base := 2 * max(g.opts.Interval, time.Second)
	return backoff.Backoff{Base: base, Cap: max(time.Hour, base)}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: one collector is enough.
func (g *GarbageCollector) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it collects now and then every Interval. Only the
// leader collects, so there are no replicas to spread apart with jitter.
func (g *GarbageCollector) Start(ctx context.Context) error {
	wait.NonSlidingUntilWithContext(ctx, g.collectAndLog, g.opts.Interval)
	return nil
}

func (g *GarbageCollector) collectAndLog(ctx context.Context) {
	c, err := g.Collect(ctx)
	g.opts.Metrics.Collected(c.Walk, c.Finished, c.Deleted, c.Undelivered)
	switch {
	case err != nil && ctx.Err() != nil:
	case err != nil:
		g.opts.Log.Warn("garbage collection failed", "error", err, "deleted", c.Deleted)
	case c.Deleted > 0 || c.Undelivered > 0:
		g.opts.Log.Info("garbage collected finished actions", "deleted", c.Deleted,
			"keptUndelivered", c.Undelivered, "undeletable", c.Undeletable, "finished", c.Finished, "maxTTL", g.opts.MaxTTL.String())
	}
}

// Collection is what one Collect did.
type Collection struct {
	// Walked is how many cached actions were looked at, in Walk, and Finished how many of
	// them had finished.
	Walked, Finished int
	Walk             time.Duration
	// Deleted actions were expired or over a bound, and delivered; Undelivered ones were
	// expired but kept, their history not yet recorded.
	Deleted, Undelivered int
	// Refused is how many deletes the API server refused in this pass; Undeletable how
	// many actions are held after it because their last delete was refused (the bounds
	// count only the others).
	Refused, Undeletable int
}

// finished is what the collector needs of a finished action, copied out of the cache.
type finished struct {
	key       types.NamespacedName
	uid       types.UID
	at        time.Time
	delivered bool
	doomed    bool
}

// Collect deletes the finished actions whose history is delivered and that finished
// more than MaxTTL ago or are the oldest over a bound. Deleting a finished action aborts
// nothing: its plugin finalized when it finished, and it carries no finalizer, so it
// goes at once and records no Aborted phase.
func (g *GarbageCollector) Collect(ctx context.Context) (Collection, error) {
	c, err := g.collect(ctx)
	c.Undeletable = len(g.refused)
	g.opts.Metrics.Undeletable(c.Undeletable)
	return c, err
}

func (g *GarbageCollector) collect(ctx context.Context) (Collection, error) {
	var c Collection
	started := time.Now()
	held, err := g.finished(ctx, &c)
	if err != nil {
		return c, err
	}
	c.Walk = time.Since(started)
	now := g.opts.Clock.Now()
	held = g.withoutRefused(held, now)
	doomed := g.pick(held, &c)
	if g.opts.DeletesPerSecond > 0 {
		if perPass := int(math.Ceil(g.opts.DeletesPerSecond * g.opts.Interval.Seconds())); g.opts.Interval > 0 && len(doomed) > perPass {
			doomed = doomed[:perPass]
		}
	}
	for _, d := range doomed {
		if g.limiter != nil {
			if err := g.limiter.Wait(ctx); err != nil {
				return c, err
			}
		}
		ta := &flytev1.TaskAction{}
		ta.Namespace, ta.Name = d.key.Namespace, d.key.Name
		// The UID precondition spares an action created again under the same name.
		err := g.writer.Delete(ctx, ta, client.Preconditions{UID: &d.uid})
		switch {
		case err == nil:
			c.Deleted++
			delete(g.refused, d.uid)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			delete(g.refused, d.uid)
		case ctx.Err() != nil || !refusedAction(err):
			// Not this action's doing: the next pass tries again.
			return c, fmt.Errorf("deleting %s: %w", d.key, err)
		default:
			c.Refused++
			g.refuse(d, err, now)
		}
	}
	return c, nil
}

// refusedAction reports whether err is the API server's answer about deleting this one
// action (a webhook's or a policy's denial, RBAC, an invalid request), rather than the
// server being unreachable, overloaded or slow, which ends the pass instead.
func refusedAction(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	return !apierrors.IsTooManyRequests(err) && !apierrors.IsServiceUnavailable(err) &&
		!apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) && !apierrors.IsUnauthorized(err)
}

// refusalReason is the metric's label for a refusal: a small fixed set.
func refusalReason(err error) string {
	switch {
	case apierrors.IsForbidden(err):
		return "forbidden"
	case apierrors.IsInvalid(err):
		return "invalid"
	case apierrors.IsBadRequest(err):
		return "bad_request"
	case apierrors.IsInternalError(err):
		return "internal"
	default:
		return "other"
	}
}

// refusalMessage is what the API server said, without the client's wrapping.
func refusalMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		return status.Status().Message
	}
	return string(apierrors.ReasonForError(err))
}

// withoutRefused leaves out of held the actions refused before whose backoff has not
// ended, so that they neither count against the bounds nor spend the pass's deletes, and
// forgets the refusals of actions no longer held.
func (g *GarbageCollector) withoutRefused(held []finished, now time.Time) []finished {
	if len(g.refused) == 0 {
		return held
	}
	seen := make(map[types.UID]bool, len(g.refused))
	kept := held[:0]
	for _, f := range held {
		r, ok := g.refused[f.uid]
		if ok {
			seen[f.uid] = true
		}
		if ok && now.Before(r.retryAt) {
			continue
		}
		kept = append(kept, f)
	}
	for uid := range g.refused {
		if !seen[uid] {
			delete(g.refused, uid)
		}
	}
	return kept
}

// refuse records a refused delete: its backoff, the metric, a log line (at most one a
// minute, with the number left unlogged) and a Warning Event on the action.
func (g *GarbageCollector) refuse(d finished, err error, now time.Time) {
	if g.refused == nil {
		g.refused = map[types.UID]*refusal{}
	}
	r := g.refused[d.uid]
	if r == nil {
		r = &refusal{}
		g.refused[d.uid] = r
	}
	r.failures = min(r.failures+1, math.MaxInt32-1)
	wait := g.refusalBackoff().Delay(r.failures)
	r.retryAt = now.Add(wait)
	reason := refusalReason(err)
	g.opts.Metrics.DeleteRefused(reason)
	if g.refusalLog == nil {
		g.refusalLog = rate.NewLimiter(rate.Every(time.Minute), 1)
	}
	if g.refusalLog.AllowN(now, 1) {
		g.opts.Log.Warn("could not delete a finished action; skipped it and collected the others", "action", d.key,
			"reason", reason, "error", err, "retryIn", wait.Round(time.Second).String(), "refusedUnlogged", g.unlogged)
		g.unlogged = 0
	} else {
		g.unlogged++
	}
	if g.opts.Recorder != nil {
		ta := &flytev1.TaskAction{}
		ta.Namespace, ta.Name, ta.UID = d.key.Namespace, d.key.Name, d.uid
		g.opts.Recorder.Eventf(ta, corev1.EventTypeWarning, ReasonDeleteRefused,
			"the garbage collector could not delete this finished action: %s; it tries again in %s",
			refusalMessage(err), wait.Round(time.Second))
	}
}

// finished lists the finished actions not being deleted, oldest first.
func (g *GarbageCollector) finished(ctx context.Context, c *Collection) ([]finished, error) {
	// The cache's own objects, not copies: only read, and only until the walk ends.
	var actions flytev1.TaskActionList
	if err := g.reader.List(ctx, &actions, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing actions: %w", err)
	}
	c.Walked = len(actions.Items)
	var held []finished
	for i := range actions.Items {
		ta := &actions.Items[i]
		done := ta.Status.CompletedAt
		if !ta.Status.Phase.IsTerminal() || done == nil || !ta.DeletionTimestamp.IsZero() {
			continue
		}
		held = append(held, finished{key: client.ObjectKeyFromObject(ta), uid: ta.UID, at: done.Time,
			delivered: g.opts.Delivered == nil || g.opts.Delivered(ta)})
	}
	c.Finished = len(held)
	slices.SortFunc(held, func(a, b finished) int { return a.at.Compare(b.at) })
	return held, nil
}

// pick marks what goes, oldest first: the expired, then the oldest of each namespace over
// its bound, then the oldest over the bound in all. Undelivered actions count against
// the bounds but stay.
func (g *GarbageCollector) pick(held []finished, c *Collection) []finished {
	cutoff := g.opts.Clock.Now().Add(-g.opts.MaxTTL)
	kept := len(held)
	perNamespace := map[string]int{}
	for i := range held {
		f := &held[i]
		switch {
		case !f.at.Before(cutoff):
			perNamespace[f.key.Namespace]++
		case f.delivered:
			f.doomed = true
			kept--
		default:
			c.Undelivered++
			perNamespace[f.key.Namespace]++
		}
	}
	if limit := g.opts.MaxFinishedPerNamespace; limit > 0 {
		for i := range held {
			f := &held[i]
			if f.delivered && !f.doomed && perNamespace[f.key.Namespace] > limit {
				f.doomed = true
				perNamespace[f.key.Namespace]--
				kept--
			}
		}
	}
	if limit := g.opts.MaxFinished; limit > 0 {
		for i := 0; i < len(held) && kept > limit; i++ {
			if f := &held[i]; f.delivered && !f.doomed {
				f.doomed = true
				kept--
			}
		}
	}
	var doomed []finished
	for _, f := range held {
		if f.doomed {
			doomed = append(doomed, f)
		}
	}
	return doomed
}
