package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// GarbageCollector deletes finished TaskActions some time after they finished, so that
// the API server does not fill up with history (the events service keeps it). It is a
// manager runnable that only the leader runs. It pages through the API server directly
// rather than the informer cache, by the label the reconciler puts on finished actions.
type GarbageCollector struct {
	// Reader lists straight from the API server (the manager's APIReader).
	Reader client.Reader
	// Writer deletes.
	Writer client.Client
	// Interval is how often to collect; MaxTTL how long a finished action is kept.
	Interval, MaxTTL time.Duration
	Clock            clock.PassiveClock
	Log              *slog.Logger
	// PageSize bounds each list call; 500 when zero.
	PageSize int64
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: one collector is enough.
func (g *GarbageCollector) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (g *GarbageCollector) Start(ctx context.Context) error {
	ticker := time.NewTicker(g.Interval)
	defer ticker.Stop()
	for {
		if n, err := g.Collect(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			g.Log.Warn("garbage collection failed", "error", err, "deleted", n)
		} else if n > 0 {
			g.Log.Info("garbage collected finished actions", "deleted", n, "maxTTL", g.MaxTTL.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Collect deletes every finished action older than MaxTTL and returns how many it
// deleted.
func (g *GarbageCollector) Collect(ctx context.Context) (int, error) {
	pageSize := g.PageSize
	if pageSize == 0 {
		pageSize = 500
	}
	cutoff := g.Clock.Now().Add(-g.MaxTTL)
	deleted := 0
	opts := []client.ListOption{client.MatchingLabels{LabelTerminal: "true"}, client.Limit(pageSize)}
	for cont := ""; ; {
		var page flytev1.TaskActionList
		if err := g.Reader.List(ctx, &page, append(opts, client.Continue(cont))...); err != nil {
			return deleted, fmt.Errorf("listing finished actions: %w", err)
		}
		for i := range page.Items {
			ta := &page.Items[i]
			done := ta.Status.CompletedAt
			if !ta.Status.Phase.IsTerminal() || done == nil || done.After(cutoff) {
				continue
			}
			// The UID precondition spares an action re-created under the same name.
			err := g.Writer.Delete(ctx, ta, client.Preconditions{UID: &ta.UID})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return deleted, fmt.Errorf("deleting %s/%s: %w", ta.Namespace, ta.Name, err)
			}
			if err == nil {
				deleted++
			}
		}
		if cont = page.Continue; cont == "" {
			return deleted, nil
		}
	}
}
