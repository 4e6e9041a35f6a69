package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/metrics"
)

// GarbageCollector deletes finished TaskActions some time after they finished, so that
// the API server does not fill up with history (the events service keeps it). It is a
// manager runnable that only the leader runs. It walks the actions the informer cache
// already holds and picks the finished ones by their status, so collecting costs the API
// server nothing but the deletes.
type GarbageCollector struct {
	// Reader lists the actions: the manager's informer cache.
	Reader client.Reader
	// Writer deletes.
	Writer client.Writer
	// Delivered reports whether an action's whole history is recorded by the events
	// service; an action whose history is not is kept. Nil when events are off.
	Delivered func(*flytev1.TaskAction) bool
	// Interval is how often to collect; MaxTTL how long a finished action is kept.
	Interval, MaxTTL time.Duration
	Clock            clock.PassiveClock
	Log              *slog.Logger
	// Metrics records each collection; nil records nothing.
	Metrics *metrics.Metrics
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: one collector is enough.
func (g *GarbageCollector) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it collects now and then every Interval. Only the
// leader collects, so there are no replicas to spread apart with jitter.
func (g *GarbageCollector) Start(ctx context.Context) error {
	wait.NonSlidingUntilWithContext(ctx, g.collectAndLog, g.Interval)
	return nil
}

func (g *GarbageCollector) collectAndLog(ctx context.Context) {
	c, err := g.Collect(ctx)
	g.Metrics.Collected(c.Walk, c.Deleted, c.Undelivered)
	switch {
	case err != nil && ctx.Err() != nil:
	case err != nil:
		g.Log.Warn("garbage collection failed", "error", err, "deleted", c.Deleted)
	case c.Deleted > 0 || c.Undelivered > 0:
		g.Log.Info("garbage collected finished actions", "deleted", c.Deleted,
			"keptUndelivered", c.Undelivered, "maxTTL", g.MaxTTL.String())
	}
}

// Collection is what one Collect did.
type Collection struct {
	// Walked is how many cached actions were looked at, in Walk.
	Walked int
	Walk   time.Duration
	// Deleted actions were old enough and delivered; Undelivered ones were old enough
	// but kept, their history not yet recorded.
	Deleted, Undelivered int
}

// expired is what is needed to delete one action, copied out of the cache.
type expired struct {
	key types.NamespacedName
	uid types.UID
}

// Collect deletes every finished action older than MaxTTL whose history is delivered.
// Deleting a finished action aborts nothing: its plugin finalized when it finished, and
// it carries no finalizer, so it goes at once and records no Aborted phase.
func (g *GarbageCollector) Collect(ctx context.Context) (Collection, error) {
	var c Collection
	cutoff := g.Clock.Now().Add(-g.MaxTTL)
	started := time.Now()
	// The cache's own objects, not copies: only read, and only until the walk ends.
	var actions flytev1.TaskActionList
	if err := g.Reader.List(ctx, &actions, client.UnsafeDisableDeepCopy); err != nil {
		return c, fmt.Errorf("listing actions: %w", err)
	}
	var doomed []expired
	for i := range actions.Items {
		ta := &actions.Items[i]
		done := ta.Status.CompletedAt
		if !ta.Status.Phase.IsTerminal() || done == nil || done.After(cutoff) || !ta.DeletionTimestamp.IsZero() {
			continue
		}
		if g.Delivered != nil && !g.Delivered(ta) {
			c.Undelivered++
			continue
		}
		doomed = append(doomed, expired{key: client.ObjectKeyFromObject(ta), uid: ta.UID})
	}
	c.Walked, c.Walk = len(actions.Items), time.Since(started)
	for _, d := range doomed {
		ta := &flytev1.TaskAction{}
		ta.Namespace, ta.Name = d.key.Namespace, d.key.Name
		// The UID precondition spares an action created again under the same name.
		err := g.Writer.Delete(ctx, ta, client.Preconditions{UID: &d.uid})
		switch {
		case err == nil:
			c.Deleted++
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		default:
			return c, fmt.Errorf("deleting %s: %w", d.key, err)
		}
	}
	return c, nil
}
