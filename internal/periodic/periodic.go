// Package periodic runs the services' background chores (retention, clean-ups, the
// relay's trimming and lag measurement) on one schedule.
package periodic

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Every runs f now and then every interval, each stretched at random by up to a tenth,
// until ctx ends: the replicas of a service, started together, then spread their
// clean-ups apart instead of all deleting at the same moment. The interval runs from
// the start of one run to the start of the next, and runs never overlap: one that takes
// longer than the interval is followed at once by the next.
func Every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	wait.JitterUntilWithContext(ctx, f, interval, 0.1, false)
}
