package controller

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestTransientLimiter(t *testing.T) {
	l := newTransientLimiter(Backoff{Base: 100 * time.Millisecond, Cap: time.Second, Rand: func() float64 { return 1 }})
	a := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}}
	b := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "b"}}
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := l.When(a); got != want*time.Millisecond {
			t.Fatalf("failure %d of a: wait %s; want %s", i+1, got, want*time.Millisecond)
		}
	}
	if got := l.When(b); got != 100*time.Millisecond {
		t.Fatalf("b waits %s after a's failures; want its own first wait", got)
	}
	if l.NumRequeues(a) != 6 {
		t.Fatalf("a requeued %d times; want 6", l.NumRequeues(a))
	}
	l.Forget(a) // a pass that succeeded
	if got := l.When(a); got != 100*time.Millisecond {
		t.Fatalf("a waits %s after a success; want the first wait again", got)
	}
	half := newTransientLimiter(Backoff{Base: 100 * time.Millisecond, Cap: time.Second, Rand: func() float64 { return 0 }})
	if got := half.When(a); got != 50*time.Millisecond {
		t.Fatalf("jitter at its low end: %s; want half the delay", got)
	}
}
