package executor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
)

// steppedClock is the real clock moved by a fixed step, as the clock of a machine whose
// time was set wrong (or stepped by NTP) reads beside the others'.
type steppedClock struct{ step time.Duration }

func (c steppedClock) Now() time.Time                  { return time.Now().Add(c.step) }
func (c steppedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

var _ clock.PassiveClock = steppedClock{}

// TestAClockStepOnOneExecutorCostsNoMoreThanTheStep: the times an executor writes in an
// action's status and plugin state (an attempt's start, the next attempt's time, a
// sleep's start) are read by whichever executor leads next, on its own clock. One whose
// clock was an hour off must not make the next one wait that hour for a backoff, a sleep
// or a timeout, nor end a sleep an hour early: what the next leader reads from the
// future is counted from its own present, and what lies before the action was created
// (the API server's clock) from that creation.
func TestAClockStepOnOneExecutorCostsNoMoreThanTheStep(t *testing.T) {
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprintf("step %s", step), func(t *testing.T) {
			ctx := context.Background()
			ns := env.Namespace(t)
			// The first executor's backoff is long enough to be seen waiting; the next one's
			// cap is shorter, as after a change of settings.
			wrongCfg, cfg := testConfig(), testConfig()
			wrongCfg.RetryBackoff.Base = metav1.Duration{Duration: 20 * time.Second}
			wrongCfg.RetryBackoff.Cap = metav1.Duration{Duration: 20 * time.Second}
			cfg.RetryBackoff.Base = metav1.Duration{Duration: 2 * time.Second}
			cfg.RetryBackoff.Cap = metav1.Duration{Duration: 2 * time.Second}
			action := func(name string, config map[string]string, timeout time.Duration) *flytev1.TaskAction {
				ta := &flytev1.TaskAction{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
					Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "clock", ActionName: name,
						TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/clock", Config: config},
				}
				if timeout > 0 {
					ta.Spec.Timeout = &metav1.Duration{Duration: timeout}
				}
				return ta
			}
			const sleep, timeout = 15 * time.Second, 20 * time.Second
			sleeping := action("sleeping", map[string]string{"duration": sleep.String()}, 0)
			retried := action("retried", map[string]string{"duration": "0s", "failAttempts": "1"}, 0)
			retried.Spec.Retries = 1
			timed := action("timed", map[string]string{"duration": "10m"}, timeout)

			// The executor with the wrong clock starts them all.
			stopWrong, _ := start(t, wrongCfg, ns, runOptions{clock: steppedClock{step}})
			for _, ta := range []*flytev1.TaskAction{sleeping, retried, timed} {
				if err := env.Client.Create(ctx, ta); err != nil {
					t.Fatal(err)
				}
			}
			waitPhase(t, client.ObjectKeyFromObject(sleeping), flytev1.PhaseRunning)
			waitPhase(t, client.ObjectKeyFromObject(timed), flytev1.PhaseRunning)
			var got flytev1.TaskAction
			eventually.True(t, time.Minute, func() bool {
				return env.Client.Get(ctx, client.ObjectKeyFromObject(retried), &got) == nil && got.Status.NextAttemptAt != nil
			}, func() string {
				return fmt.Sprintf("the retried action was not waiting for its next attempt: %+v", got.Status)
			})
			stopWrong()

			// The next executor reads the same clock as the API server.
			handed := time.Now()
			start(t, cfg, ns, runOptions{})
			for _, c := range []struct {
				ta   *flytev1.TaskAction
				want flytev1.Phase
				// most is how long it may take after the hand-over: what is left of its own
				// work, and then some for passes and a loaded machine, but far from the step.
				most time.Duration
				// least is how long after its creation it may end at the earliest.
				least time.Duration
			}{
				{sleeping, flytev1.PhaseSucceeded, sleep + 30*time.Second, sleep},
				{retried, flytev1.PhaseSucceeded, 30 * time.Second, 0},
				{timed, flytev1.PhaseTimedOut, timeout + 30*time.Second, timeout},
			} {
				key := client.ObjectKeyFromObject(c.ta)
				var ta flytev1.TaskAction
				eventually.True(t, c.most, func() bool {
					return env.Client.Get(ctx, key, &ta) == nil && ta.Status.Phase == c.want
				}, func() string {
					return fmt.Sprintf("%s did not end %s within %s of the hand-over; status %+v", key.Name, c.want, c.most, ta.Status)
				})
				// Started an hour "ago" by the wrong clock, a sleep must still be slept and a
				// timeout still given its time: neither ends before the creation plus that.
				if done := ta.Status.CompletedAt.Time; done.Before(ta.CreationTimestamp.Add(c.least)) {
					t.Errorf("%s ended at %s, sooner than %s after its creation at %s", key.Name, done, c.least, ta.CreationTimestamp)
				}
			}
			t.Logf("all ended %s after the hand-over", time.Since(handed).Round(time.Millisecond))
		})
	}
}
