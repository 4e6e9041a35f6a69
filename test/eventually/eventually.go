// Package eventually waits in tests for what happens in the background: a condition
// checked every 20 ms until it holds, or the test fails.
package eventually

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Interval is how often a condition is checked.
const Interval = 20 * time.Millisecond

// True checks cond at once and then every Interval until it returns true, and fails the
// test once timeout has passed without it, with the message msg returns then: msg runs
// after cond's last call, so it can show the last state cond saw.
func True(t testing.TB, timeout time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), Interval, timeout, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s (waited %s)", msg(), timeout)
	}
}
