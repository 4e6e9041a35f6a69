package controller

import (
	"math"
	"time"
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
