package controller

import (
	"math"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Backoff is the wait before a new attempt: exponential in the number of failures so far,
// capped, and jittered over its upper half so that actions failing together do not
// retry together ("equal jitter": half the delay is kept, half is random).
type Backoff struct {
	Base, Cap time.Duration
	// Rand returns a number in [0, 1); tests fix it.
	Rand func() float64
}

// Delay is the wait after the n-th failure (n >= 1).
func (b Backoff) Delay(n int32) time.Duration {
	if n < 1 {
		n = 1
	}
	d := float64(b.Base) * math.Pow(2, float64(n-1))
	if d > float64(b.Cap) || math.IsInf(d, 0) {
		d = float64(b.Cap)
	}
	half := d / 2
	return time.Duration(half + half*b.Rand())
}

// transientLimiter spaces out the passes that failed on a transient error (a throttled
// or failed API call): the same Backoff, per action, from the number of failures in a
// row, which a successful pass resets. It is the work queue's rate limiter, so these
// waits cost no status write: a write per throttled call would add load to the API
// server that is throttling. They show in flyte_executor_retries_total{kind="transient"}.
type transientLimiter struct {
	backoff  Backoff
	mu       sync.Mutex
	failures map[reconcile.Request]int32
}

func newTransientLimiter(b Backoff) *transientLimiter {
	return &transientLimiter{backoff: b, failures: map[reconcile.Request]int32{}}
}

// When implements workqueue.TypedRateLimiter.
func (l *transientLimiter) When(item reconcile.Request) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures[item]++
	return l.backoff.Delay(l.failures[item])
}

// Forget implements workqueue.TypedRateLimiter.
func (l *transientLimiter) Forget(item reconcile.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.failures, item)
}

// NumRequeues implements workqueue.TypedRateLimiter.
func (l *transientLimiter) NumRequeues(item reconcile.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.failures[item])
}
