package backoff_test

import (
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/flytekube/backend/internal/backoff"
)

func fixed(r float64) func() float64 { return func() float64 { return r } }

func TestDelay(t *testing.T) {
	low := backoff.Backoff{Base: time.Second, Cap: 10 * time.Second, Rand: fixed(0)}
	high := backoff.Backoff{Base: time.Second, Cap: 10 * time.Second, Rand: fixed(0.999)}
	tests := []struct {
		name string
		b    backoff.Backoff
		n    int32
		want time.Duration
	}{
		{"below the first failure counts as the first", low, 0, 500 * time.Millisecond},
		{"first failure, jitter at its low end: half the base", low, 1, 500 * time.Millisecond},
		{"doubles", low, 2, time.Second},
		{"doubles again", low, 3, 2 * time.Second},
		{"capped", low, 5, 5 * time.Second},
		{"capped far out", low, 60, 5 * time.Second},
		{"full jitter stays under the cap", high, 60, 9995 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.b.Delay(tt.n); got != tt.want {
				t.Errorf("Delay(%d) = %s; want %s", tt.n, got, tt.want)
			}
		})
	}
	unfixed := backoff.Backoff{Base: time.Second, Cap: 10 * time.Second}
	for range 100 {
		if got := unfixed.Delay(60); got < 5*time.Second || got >= 10*time.Second {
			t.Fatalf("Delay with math/rand = %s; want in [5s, 10s)", got)
		}
	}
}

func TestDelayFuncStepsAndStartsOver(t *testing.T) {
	b := backoff.Backoff{Base: 100 * time.Millisecond, Cap: time.Second, Rand: fixed(1)}
	next := b.DelayFunc()
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := next(); got != want*time.Millisecond {
			t.Fatalf("wait %d: %s; want %s", i+1, got, want*time.Millisecond)
		}
	}
	if got := b.DelayFunc()(); got != 100*time.Millisecond {
		t.Fatalf("a new DelayFunc waits %s first; want the base", got)
	}
}

func TestLimiter(t *testing.T) {
	var l workqueue.TypedRateLimiter[string] = backoff.NewLimiter[string](
		backoff.Backoff{Base: 100 * time.Millisecond, Cap: time.Second, Rand: fixed(1)})
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := l.When("a"); got != want*time.Millisecond {
			t.Fatalf("failure %d of a: wait %s; want %s", i+1, got, want*time.Millisecond)
		}
	}
	if got := l.When("b"); got != 100*time.Millisecond {
		t.Fatalf("b waits %s after a's failures; want its own first wait", got)
	}
	if l.NumRequeues("a") != 6 {
		t.Fatalf("a requeued %d times; want 6", l.NumRequeues("a"))
	}
	l.Forget("a") // a success
	if got := l.When("a"); got != 100*time.Millisecond {
		t.Fatalf("a waits %s after a success; want the first wait again", got)
	}
	half := backoff.NewLimiter[string](backoff.Backoff{Base: 100 * time.Millisecond, Cap: time.Second, Rand: fixed(0)})
	if got := half.When("a"); got != 50*time.Millisecond {
		t.Fatalf("jitter at its low end: %s; want half the delay", got)
	}
}
