// Package backoff is the one spacing of retries in this project: exponential in the
// failures so far, capped, and jittered. The controller spaces attempts with it, the
// work queues of the controller and of the events publisher space failed items with it,
// the Kubernetes plugins wait for a ResourceQuota to make room by it,
// and loops that reconnect or wait for a dependency (the watch hub, Postgres at start)
// run on wait's loops with its delays.
//
// It is ours, not wait.Backoff, for two reasons. The controller needs the delay after
// the n-th failure from n alone, because n is kept in the action's status across
// restarts, while wait.Backoff only steps forward from its start. And wait's jitter is
// added on top of the delay, so a capped delay can exceed its cap by the jitter; ours
// stays within [delay/2, delay] and never exceeds Cap.
package backoff

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Backoff is the wait before a new try: exponential in the number of failures so far,
// capped, and jittered over its upper half so that callers failing together do not
// retry together ("equal jitter": half the delay is kept, half is random).
type Backoff struct {
	Base, Cap time.Duration
	// Rand returns a number in [0, 1); nil means math/rand. Tests fix it.
	Rand func() float64
}

// Delay is the wait after the n-th failure in a row (n >= 1).
func (b Backoff) Delay(n int32) time.Duration {
	if n < 1 {
		n = 1
	}
	d := float64(b.Base) * math.Pow(2, float64(n-1))
	if d > float64(b.Cap) || math.IsInf(d, 0) {
		d = float64(b.Cap)
	}
	r := rand.Float64
	if b.Rand != nil {
		r = b.Rand
	}
	half := d / 2
	return time.Duration(half + half*r())
}

// DelayFunc returns the waits after the first, second, ... failure in a row, for wait's
// loops (wait.DelayFunc.Until). A new DelayFunc starts again from the first.
func (b Backoff) DelayFunc() wait.DelayFunc {
	var n int32
	return func() time.Duration {
		n = min(n+1, math.MaxInt32-1)
		return b.Delay(n)
	}
}

// Limiter is a work queue's rate limiter (workqueue.TypedRateLimiter) that spaces each
// item's retries by a Backoff, from that item's failures in a row; Forget (a success)
// starts the item over.
type Limiter[T comparable] struct {
	backoff  Backoff
	mu       sync.Mutex
	failures map[T]int32
}

// NewLimiter returns a Limiter spacing retries by b.
func NewLimiter[T comparable](b Backoff) *Limiter[T] {
	return &Limiter[T]{backoff: b, failures: map[T]int32{}}
}

// When implements workqueue.TypedRateLimiter.
func (l *Limiter[T]) When(item T) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures[item] = min(l.failures[item]+1, math.MaxInt32-1)
	return l.backoff.Delay(l.failures[item])
}

// Forget implements workqueue.TypedRateLimiter.
func (l *Limiter[T]) Forget(item T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.failures, item)
}

// NumRequeues implements workqueue.TypedRateLimiter.
func (l *Limiter[T]) NumRequeues(item T) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.failures[item])
}
