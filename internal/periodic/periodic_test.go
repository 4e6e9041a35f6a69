package periodic_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flytekube/backend/internal/periodic"
)

// Every runs f at once, again after each interval, and returns once its context ends.
func TestEveryRunsAtOnceAndUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Every(ctx, 10*time.Millisecond, func(context.Context) {
			if runs.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("Every still running after %d runs and its context's end", runs.Load())
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("f ran %d times; want 3, the last one ending the context", n)
	}
}

// The first run does not wait for the interval.
func TestEveryRunsFirstWithoutWaiting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Buffered: f may run before the test waits for it, and must not drop the news.
	ran := make(chan struct{}, 1)
	go periodic.Every(ctx, time.Hour, func(context.Context) {
		select {
		case ran <- struct{}{}:
		default:
		}
	})
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("f did not run before the first interval passed")
	}
}
