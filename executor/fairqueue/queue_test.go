package fairqueue_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"

	"github.com/flytekube/backend/executor/fairqueue"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/metricstest"
)

// Items are "tenant/name".
func tenantOf(item string) string { return strings.SplitN(item, "/", 2)[0] }

func newQueue(t *testing.T, opts fairqueue.Options[string]) *fairqueue.Queue[string] {
	t.Helper()
	if opts.TenantOf == nil {
		opts.TenantOf = tenantOf
	}
	q := fairqueue.New(opts)
	t.Cleanup(q.ShutDown)
	return q
}

// drain takes n items, each Done at once, and returns them in the order handed out.
func drain(t *testing.T, q priorityqueue.PriorityQueue[string], n int) []string {
	t.Helper()
	var got []string
	for range n {
		item, shutdown := q.Get()
		if shutdown {
			t.Fatalf("queue shut down after %d items", len(got))
		}
		got = append(got, item)
		q.Done(item)
	}
	return got
}

// backlogThenInteractive queues a backlog of 1,000 items of one tenant, then 3 of
// another, and returns where among the items handed out the last of the 3 came.
func backlogThenInteractive(t *testing.T, q priorityqueue.PriorityQueue[string]) int {
	t.Helper()
	for i := range 1000 {
		q.Add(fmt.Sprintf("batch/%d", i))
	}
	for i := range 3 {
		q.Add(fmt.Sprintf("interactive/%d", i))
	}
	// Items are queued asynchronously in controller-runtime's queue.
	eventually.True(t, 5*time.Second, func() bool { return q.Len() == 1003 },
		func() string { return fmt.Sprintf("%d items queued, want 1003", q.Len()) })
	order := drain(t, q, 1003)
	return slices.Index(order, "interactive/2")
}

// controller-runtime's queue is first in, first out across tenants: the backlog goes
// first. This is what the fair queue is for.
func TestControllerRuntimeQueueServesABacklogFirst(t *testing.T) {
	q := priorityqueue.New[string]("")
	defer q.ShutDown()
	if at := backlogThenInteractive(t, q); at != 1002 {
		t.Fatalf("the last interactive item came at %d, want 1002 (behind the backlog)", at)
	}
}

func TestOneTenantsBacklogDoesNotHoldUpAnother(t *testing.T) {
	// Two tenants of weight 1 alternate: the 3 interactive items come within the first 6.
	if at := backlogThenInteractive(t, newQueue(t, fairqueue.Options[string]{})); at > 5 {
		t.Fatalf("the last interactive item came at %d, want within the first 6", at)
	}
}

func TestTenantsAreServedByWeight(t *testing.T) {
	weights := map[string]int{"a": 3, "b": 1, "c": 0} // 0 counts as 1
	q := newQueue(t, fairqueue.Options[string]{Weight: func(tenant string) int { return weights[tenant] }})
	for i := range 6 {
		for _, tenant := range []string{"a", "b", "c"} {
			q.Add(fmt.Sprintf("%s/%d", tenant, i))
		}
	}
	var tenants []string
	for _, item := range drain(t, q, 18) {
		tenants = append(tenants, tenantOf(item))
	}
	// a first (it entered first), its turn of 3, then b's and c's of 1; c runs out last.
	want := strings.Split("a a a b c a a a b c b c b c b c", " ")
	want = append(want, "b", "c")
	if !slices.Equal(tenants, want) {
		t.Fatalf("served %v\nwant   %v", tenants, want)
	}
}

func TestItemsAreOrderedWithinATenant(t *testing.T) {
	q := newQueue(t, fairqueue.Options[string]{})
	for _, item := range []string{"a/1", "b/1", "a/2", "a/3", "b/2"} {
		q.Add(item)
	}
	got := drain(t, q, 5)
	want := []string{"a/1", "b/1", "a/2", "b/2", "a/3"}
	if !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
	}
}

func TestHigherPriorityGoesFirstAcrossTenants(t *testing.T) {
	q := newQueue(t, fairqueue.Options[string]{})
	low, high := -100, 0
	// A restart's backlog (the informer's first list, at low priority) ...
	q.AddWithOpts(priorityqueue.AddOpts{Priority: &low}, "a/old1", "a/old2", "b/old1")
	// ... is served after new work, whichever tenant it is.
	q.AddWithOpts(priorityqueue.AddOpts{Priority: &high}, "c/new")
	// An item raised to a higher priority goes to the back of that priority's line.
	q.AddWithOpts(priorityqueue.AddOpts{Priority: &high}, "a/old2")
	// A lower priority does not lower it.
	q.AddWithOpts(priorityqueue.AddOpts{Priority: &low}, "c/new")

	var got []string
	var priorities []int
	for range 4 {
		item, priority, _ := q.GetWithPriority()
		got, priorities = append(got, item), append(priorities, priority)
		q.Done(item)
	}
	if want := []string{"c/new", "a/old2", "a/old1", "b/old1"}; !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
	}
	if want := []int{0, 0, -100, -100}; !slices.Equal(priorities, want) {
		t.Fatalf("priorities %v, want %v", priorities, want)
	}
}

func TestAnItemIsQueuedOnce(t *testing.T) {
	q := newQueue(t, fairqueue.Options[string]{})
	q.Add("a/1")
	q.Add("a/1")
	q.AddAfter("a/1", time.Hour)
	if n := q.Len(); n != 1 {
		t.Fatalf("Len %d, want 1", n)
	}
	drain(t, q, 1)
	if n := q.Len(); n != 0 {
		t.Fatalf("Len %d after the item was taken, want 0", n)
	}
}

func TestAnItemInProgressIsNotHandedOutAgain(t *testing.T) {
	q := newQueue(t, fairqueue.Options[string]{})
	q.Add("a/1")
	item, _ := q.Get()
	q.Add("a/1") // an event while it is reconciled
	q.Add("a/2")
	if next, _ := q.Get(); next != "a/2" {
		t.Fatalf("got %q while a/1 was in progress, want a/2", next)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("Len %d with a/1 in progress, want 0", n)
	}
	q.Done(item)
	if again, _ := q.Get(); again != "a/1" {
		t.Fatalf("got %q after Done, want a/1 again", again)
	}
}

func TestWaitingItemsComeWhenDue(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	q := newQueue(t, fairqueue.Options[string]{Clock: clock})
	q.AddAfter("a/late", 10*time.Second)
	q.AddAfter("a/early", 10*time.Second)
	q.AddAfter("a/early", 2*time.Second) // the earlier time wins
	q.AddAfter("a/late", 20*time.Second) // a later one does not
	q.AddAfter("b/now", 0)
	if got := drain(t, q, 1); got[0] != "b/now" {
		t.Fatalf("got %v, want b/now", got)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("Len %d before anything is due, want 0", n)
	}
	step := func(d time.Duration, want int) {
		t.Helper()
		// The timer loop promotes what is due by the clock's time whenever it runs, so
		// a step taken before its timer is set is seen too.
		clock.Step(d)
		eventually.True(t, 5*time.Second, func() bool { return q.Len() == want },
			func() string { return fmt.Sprintf("Len %d after %s, want %d", q.Len(), d, want) })
	}
	step(2*time.Second, 1)
	if got := drain(t, q, 1); got[0] != "a/early" {
		t.Fatalf("got %v, want a/early", got)
	}
	step(8*time.Second, 1)
	// Adding a waiting item now makes it ready.
	q.AddAfter("c/1", time.Hour)
	q.Add("c/1")
	if got := drain(t, q, 2); !slices.Equal(got, []string{"a/late", "c/1"}) {
		t.Fatalf("got %v, want a/late, c/1", got)
	}
}

// TestAClockThatMovesWhileTheTimerIsSetIsSeen: the timer loop reads the clock, then sets
// a timer for the earliest waiting item. A clock that moves in between (here a fake one
// stepped as the timer is set; in CI, a test's Step between the two) made the timer count
// from the later time, and for a fake clock never fire: the item stayed waiting
// (TestWaitingItemsComeWhenDue failed so, once). Only red before the loop checked the
// deadline again when no wake of the loop is pending as the timer is set, which this
// test does not control.
func TestAClockThatMovesWhileTheTimerIsSetIsSeen(t *testing.T) {
	clock := &steppingClock{FakeClock: clocktesting.NewFakeClock(time.Now())}
	q := newQueue(t, fairqueue.Options[string]{Clock: clock})
	clock.stepOnNextTimer(2 * time.Second)
	q.AddAfter("a/1", 2*time.Second)
	eventually.True(t, 5*time.Second, func() bool { return q.Len() == 1 },
		func() string { return "a/1 is still waiting though the clock passed its time" })
}

// steppingClock steps its fake time when the next timer is set, before setting it.
type steppingClock struct {
	*clocktesting.FakeClock
	mu   sync.Mutex
	step time.Duration
}

func (c *steppingClock) stepOnNextTimer(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.step = d
}

func (c *steppingClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	step := c.step
	c.step = 0
	c.mu.Unlock()
	if step > 0 {
		c.Step(step)
	}
	return c.FakeClock.NewTimer(d)
}

func TestRateLimitedItemsWaitTheirLimit(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute)
	q := newQueue(t, fairqueue.Options[string]{Clock: clock, RateLimiter: limiter})
	q.AddRateLimited("a/1")
	q.AddRateLimited("a/1") // the limiter's second delay (2 s) is later: the first stands
	if n := q.NumRequeues("a/1"); n != 2 {
		t.Fatalf("NumRequeues %d, want 2", n)
	}
	clock.Step(time.Second)
	eventually.True(t, 5*time.Second, func() bool { return q.Len() == 1 }, func() string { return "a/1 is not ready after 1 s" })
	q.Forget("a/1")
	if n := q.NumRequeues("a/1"); n != 0 {
		t.Fatalf("NumRequeues %d after Forget, want 0", n)
	}
}

func TestShutDownReleasesGet(t *testing.T) {
	q := newQueue(t, fairqueue.Options[string]{})
	got := make(chan bool)
	go func() {
		_, shutdown := q.Get()
		got <- shutdown
	}()
	time.Sleep(20 * time.Millisecond)
	q.ShutDown()
	select {
	case shutdown := <-got:
		if !shutdown {
			t.Fatal("Get returned without shutdown")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get still blocked after ShutDown")
	}
	q.Add("a/1")
	if n := q.Len(); n != 0 || !q.ShuttingDown() {
		t.Fatalf("Len %d, ShuttingDown %v after ShutDown, want 0, true", n, q.ShuttingDown())
	}
}

func TestMetricsFollowTheActiveTenants(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics, err := fairqueue.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	clock := clocktesting.NewFakeClock(time.Now())
	q := newQueue(t, fairqueue.Options[string]{Clock: clock, Metrics: metrics, IdleAfter: 5 * time.Minute})
	for i := range 1000 {
		q.Add(fmt.Sprintf("tenant-%d/x", i))
	}
	q.Add("tenant-0/y")
	depth := func(tenant string) float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, family := range families {
			if family.GetName() != "flyte_executor_queue_depth" {
				continue
			}
			for _, m := range family.GetMetric() {
				if m.GetLabel()[0].GetValue() == tenant {
					return m.GetGauge().GetValue()
				}
			}
		}
		t.Fatalf("no depth series for %s", tenant)
		return 0
	}
	if d := depth("tenant-0"); d != 2 {
		t.Fatalf("depth of tenant-0 %v, want 2", d)
	}
	clock.Step(3 * time.Second)
	drain(t, q, 1001)
	if d := depth("tenant-0"); d != 0 {
		t.Fatalf("depth of tenant-0 %v after the drain, want 0", d)
	}
	if n := testutil.CollectAndCount(reg, "flyte_executor_queue_wait_seconds"); n != 1000 {
		t.Fatalf("%d wait series, want 1000", n)
	}
	// A month of tenants coming and going leaves nothing behind: idle ones are forgotten.
	for range 6 {
		clock.Step(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	eventually.True(t, 5*time.Second, func() bool { return testutil.CollectAndCount(reg) == 0 },
		func() string { return fmt.Sprintf("%d series left for idle tenants", testutil.CollectAndCount(reg)) })
	if n := q.Tenants(); n != 0 {
		t.Fatalf("the queue remembers %d idle tenants, want 0", n)
	}
}

// TestRandomOperationsKeepTheContract drives the queue with a seeded random mix of adds
// (at two priorities, with promotions as the clock moves), gets and dones, against a
// model: every item added is handed out, none twice at once.
func TestRandomOperationsKeepTheContract(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed))
			clock := clocktesting.NewFakeClock(time.Now())
			q := newQueue(t, fairqueue.Options[string]{Clock: clock, PromoteAfter: time.Second})
			priorities := []int{-100, 0}
			queued := map[string]bool{}       // added and not handed out since
			inProgress := map[string]bool{}   // handed out, not Done
			pendingAgain := map[string]bool{} // added while in progress
			tenants := 1 + rng.IntN(6)
			for step := range 5000 {
				switch op := rng.IntN(10); {
				case op < 5:
					item := fmt.Sprintf("t%d/%d", rng.IntN(tenants), rng.IntN(30))
					q.AddWithOpts(priorityqueue.AddOpts{Priority: &priorities[rng.IntN(2)]}, item)
					if rng.IntN(4) == 0 {
						clock.Step(300 * time.Millisecond)
					}
					if inProgress[item] {
						pendingAgain[item] = true
					} else {
						queued[item] = true
					}
				case op < 8 && len(queued) > 0:
					if q.Len() != len(queued) {
						t.Fatalf("step %d: Len %d, model has %d ready", step, q.Len(), len(queued))
					}
					item, _ := q.Get()
					if !queued[item] || inProgress[item] {
						t.Fatalf("step %d: handed out %q, queued %v, in progress %v", step, item, queued[item], inProgress[item])
					}
					delete(queued, item)
					inProgress[item] = true
				case len(inProgress) > 0:
					for item := range inProgress {
						q.Done(item)
						delete(inProgress, item)
						if pendingAgain[item] {
							delete(pendingAgain, item)
							queued[item] = true
						}
						break
					}
				}
			}
			for item := range inProgress {
				q.Done(item)
				if pendingAgain[item] {
					queued[item] = true
				}
			}
			for range len(queued) {
				item, _ := q.Get()
				if !queued[item] {
					t.Fatalf("handed out %q, not queued", item)
				}
				delete(queued, item)
				q.Done(item)
			}
			if n := q.Len(); n != 0 {
				t.Fatalf("Len %d after the drain, want 0", n)
			}
		})
	}
}

// A low-priority item (the informer's first list after a failover, or a requeue that
// kept that priority: a timeout, a backoff, a cache wait) is not starved by a stream of
// higher-priority work, in another tenant or its own: once it has waited PromoteAfter
// behind it, it is served at that priority, in its tenant's turn. Before that, the
// higher priority goes first.
func TestALowPriorityItemIsNotStarvedByAStream(t *testing.T) {
	const (
		promoteAfter = 30 * time.Second
		step         = time.Second // the clock moves this much between two items handed out
		backlog      = 20          // burst items ready at any time
		steps        = 300
	)
	low, normal := -100, 0
	cases := []struct {
		name string
		// add queues the low-priority item and returns it once it is ready.
		add func(q *fairqueue.Queue[string], clock *clocktesting.FakeClock) string
		// within is how many items may be handed out, once it is promoted, before it.
		within int
	}{
		{name: "another tenant's item from the first list", within: 2,
			add: func(q *fairqueue.Queue[string], _ *clocktesting.FakeClock) string {
				q.AddWithOpts(priorityqueue.AddOpts{Priority: &low}, "quiet/old")
				return "quiet/old"
			}},
		{name: "another tenant's requeue at low priority", within: 2,
			add: func(q *fairqueue.Queue[string], clock *clocktesting.FakeClock) string {
				q.AddWithOpts(priorityqueue.AddOpts{Priority: &low, After: 5 * time.Second}, "quiet/timeout")
				clock.Step(5 * time.Second)
				eventually.True(t, 5*time.Second, func() bool { return q.Len() == backlog+1 },
					func() string { return "the requeue never became ready" })
				return "quiet/timeout"
			}},
		{name: "the bursting tenant's own older item", within: backlog + 2,
			add: func(q *fairqueue.Queue[string], _ *clocktesting.FakeClock) string {
				q.AddWithOpts(priorityqueue.AddOpts{Priority: &low}, "burst/old")
				return "burst/old"
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := clocktesting.NewFakeClock(time.Now())
			reg := prometheus.NewRegistry()
			metrics, err := fairqueue.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			q := newQueue(t, fairqueue.Options[string]{Clock: clock, PromoteAfter: promoteAfter, Metrics: metrics})
			next := 0
			burst := func() {
				q.AddWithOpts(priorityqueue.AddOpts{Priority: &normal}, fmt.Sprintf("burst/%d", next))
				next++
			}
			for range backlog {
				burst()
			}
			item := c.add(q, clock)
			for i := range steps {
				got, priority, _ := q.GetWithPriority()
				q.Done(got)
				if got == item {
					if promoted := int(promoteAfter / step); i < promoted-1 {
						t.Fatalf("%s handed out after %d items, before it waited %s behind higher priorities", item, i, promoteAfter)
					} else if i > promoted+c.within {
						t.Fatalf("%s handed out after %d items; want at most %d", item, i, promoted+c.within)
					}
					if priority != normal {
						t.Errorf("%s handed out at priority %d; want %d, the priority it was promoted to", item, priority, normal)
					}
					metricstest.Require(t, reg, fmt.Sprintf(`flyte_executor_queue_promoted_total{namespace=%q} 1`, tenantOf(item)))
					return
				}
				burst()
				clock.Step(step)
			}
			t.Fatalf("%s never handed out in %d items of a stream of higher priority", item, steps)
		})
	}
}
