package cacheclient

import (
	"cmp"
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"k8s.io/client-go/util/workqueue"

	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/internal/backoff"
)

// Releases of gone actions' reservations are made in the background (Start), never by
// the informer's delete handler (Gone): a cache service that is slow, or accepts calls
// and never answers, would hold the handler for a call's timeout per deleted action. A
// release that cannot be made costs little: the reservation expires by itself a few
// heartbeat intervals after its heartbeats stopped, and an identical action waits that
// long at most.
const (
	// DefaultMaxQueuedReleases bounds the releases waiting to be made (Cache's
	// Options.MaxQueuedReleases); past it one is dropped, counted
	// (flyte_executor_cache_releases_total{result="dropped"}) and logged.
	DefaultMaxQueuedReleases = 10_000
	// maxReleaseTries bounds the tries of one release; the backoff between them outlasts
	// the reservations' expiry.
	maxReleaseTries = 8
	// releaseWorkers make releases at once, so that one call waiting out its timeout
	// does not hold up the others.
	releaseWorkers = 4
)

// Results of a release, the label of flyte_executor_cache_releases_total.
const (
	ReleaseReleased = "released"
	ReleaseFailed   = "failed"  // every try failed; the reservation expires by itself
	ReleaseDropped  = "dropped" // the queue was full, or the executor stopped first
)

// release is a reservation to give back.
type release struct {
	key   *cachev1.CacheKey
	owner string
}

// releaseQueue is the releases waiting, by owner (one reservation an action), with
// retries rate limited.
func newReleaseQueue() workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig[string](
		backoff.NewLimiter[string](backoff.Backoff{Base: 200 * time.Millisecond, Cap: 30 * time.Second}),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "cache_releases"})
}

// queueRelease hands a reservation whose heartbeats have stopped to the workers; the
// caller holds c.mu.
func (c *Cache) queueRelease(r release) {
	if _, ok := c.releasing[r.owner]; !ok && len(c.releasing) >= cmp.Or(c.opts.MaxQueuedReleases, DefaultMaxQueuedReleases) {
		c.opts.Metrics.CacheReleased(ReleaseDropped)
		c.log.Warn("too many reservations wait to be released; this one expires by itself instead",
			"owner", r.owner, "queued", len(c.releasing))
		return
	}
	c.releasing[r.owner] = r
	c.releases.Add(r.owner)
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: a replica gives back
// what it held, leader or not. Only the leader's reconciles take reservations, and a
// leader that loses its leadership stops its manager, and with it this Start.
func (c *Cache) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable: until ctx ends, it heartbeats the reservations held
// (keepAlive) and makes the queued releases. Then the heartbeats stop, and Start returns
// once they have: the reservations held lapse by themselves unless the next leader
// resumes them (Resume). What is still queued for release is dropped (counted, logged)
// and expires by itself.
func (c *Cache) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.beats != nil {
		c.mu.Unlock()
		return errors.New("cache: started twice")
	}
	c.beats = ctx
	for _, h := range c.holding {
		c.heartbeat(h) // held before Start
	}
	c.mu.Unlock()
	done := make(chan struct{})
	for range releaseWorkers {
		go func() {
			defer func() { done <- struct{}{} }()
			for c.releaseNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	c.mu.Lock()
	c.stopped = true // no heartbeat starts from here on, so beating.Wait cannot miss one
	c.mu.Unlock()
	c.beating.Wait()
	c.releases.ShutDown()
	for range releaseWorkers {
		<-done
	}
	c.mu.Lock()
	left := len(c.releasing)
	clear(c.releasing)
	c.mu.Unlock()
	if left > 0 {
		for range left {
			c.opts.Metrics.CacheReleased(ReleaseDropped)
		}
		c.log.Warn("stopping with reservations not released; they expire by themselves", "reservations", left)
	}
	return nil
}

// releaseNext makes one queued release; false once the queue is shut down.
func (c *Cache) releaseNext(ctx context.Context) bool {
	owner, shutdown := c.releases.Get()
	if shutdown {
		return false
	}
	defer c.releases.Done(owner)
	c.mu.Lock()
	r, ok := c.releasing[owner]
	c.mu.Unlock()
	if !ok {
		c.releases.Forget(owner)
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	_, err := c.client.ReleaseReservation(rctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: r.key, OwnerId: r.owner}))
	cancel()
	tries := c.releases.NumRequeues(owner) + 1
	switch {
	case err != nil && ctx.Err() != nil:
		return true // stopping: Start counts what is left
	case err != nil && tries < maxReleaseTries:
		c.log.Info("releasing a gone action's reservation failed; will try again", "owner", owner, "tries", tries, "error", err)
		c.releases.AddRateLimited(owner)
		return true
	}
	c.mu.Lock()
	delete(c.releasing, owner)
	c.mu.Unlock()
	c.releases.Forget(owner)
	if err != nil {
		c.opts.Metrics.CacheReleased(ReleaseFailed)
		c.log.Warn("releasing a gone action's reservation failed on every try; it expires by itself", "owner", owner, "tries", tries, "error", err)
		return true
	}
	c.opts.Metrics.CacheReleased(ReleaseReleased)
	return true
}
