package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/systemtest"
)

// The kinds of fault.
const (
	faultKillLeader    = "kill-leader"       // SIGKILL of the executor holding the lease
	faultKillEvents    = "kill-events"       // SIGKILL of the events service
	faultKillCache     = "kill-cache"        // SIGKILL of the cache service
	faultPostgres      = "restart-postgres"  // immediate shutdown and start of Postgres
	faultAPIServer     = "restart-apiserver" // kube-apiserver stopped and started on the same etcd
	faultDeleteRunning = "delete-pod"        // graceful deletion of a running pod
	// Through the fault proxy (proxy.go), on one link drawn from the seed, for a while
	// drawn from it, then taken off.
	faultSlowLink   = "slow-link"      // latency with jitter, both ways
	faultNarrowLink = "narrow-link"    // a bandwidth limit, both ways
	faultHalfOpen   = "half-open-link" // connections accepted and never answered (toxiproxy's timeout)
	// The executors cut off from every events replica for longer than gc.maxTTL.
	faultEventsOutage = "events-outage"
	// The file system of the data store frozen (fsfreeze): every write to it, the
	// executor's and the pods', waits until it thaws (store.go).
	faultStallStore = "stall-store"
	// A finished chaos action the API server refuses to delete (a
	// ValidatingAdmissionPolicy matching a label the soak puts on it; undeletable.go).
	faultUndeletable = "undeletable"
)

var faultKinds = []string{faultKillLeader, faultKillEvents, faultKillCache, faultPostgres, faultAPIServer, faultDeleteRunning,
	faultSlowLink, faultNarrowLink, faultHalfOpen, faultEventsOutage, faultStallStore, faultUndeletable}

// span is the time a fault acted, and what it acted on: a link, a program, an action.
type span struct {
	kind, target string
	from, to     time.Time
}

// faults fires faults one at a time at random times and keeps the system whole between
// them: what it kills it starts again.
type faults struct {
	s   *system
	obs *observer
	rnd *rand.Rand
	log func(format string, args ...any)

	mu      sync.Mutex
	counts  map[string]int
	outages []window // when the API server was down, and a little after
	// outageFrom is when the outage in progress began (zero when none is).
	outageFrom time.Time
	errs       []string
	deleted    []string // pods deleted by the soak
	spans      []span
	// undeletable are the chaos actions made undeletable, by name.
	undeletable map[string]bool
	// long says the run is long enough for faults held longer (a few minutes or more).
	long bool
	// kept says a chaos action is one the client never deletes.
	kept func(name string) bool
	// kinds are the kinds this run fires: faultKinds, less those the machine cannot
	// inject (stall-store needs root).
	kinds []string
}

// window is a span of time in which the soak caused some exits.
type window struct{ from, to time.Time }

func newFaults(s *system, obs *observer, rnd *rand.Rand, log func(string, ...any)) *faults {
	f := &faults{s: s, obs: obs, rnd: rnd, log: log, counts: map[string]int{}, undeletable: map[string]bool{}}
	for _, k := range faultKinds {
		if k == faultStallStore && s.store == nil {
			continue
		}
		f.kinds = append(f.kinds, k)
	}
	return f
}

// run fires faults until the chaos ends: every kind once first, in a seeded order, so
// that a short run has them all, then kinds at random. Between two faults the system
// gets a random pause.
func (f *faults) run(ctx context.Context, d time.Duration) {
	order := firstRound(f.rnd, f.kinds)
	end := time.Now().Add(d)
	for i := 0; ; i++ {
		gap := time.Duration(1+f.rnd.IntN(4)) * time.Second
		if i >= len(order) {
			gap = time.Duration(3+f.rnd.IntN(15)) * time.Second
		}
		kind := ""
		if i < len(order) {
			kind = order[i]
		} else {
			kind = f.kinds[f.rnd.IntN(len(f.kinds))]
		}
		sleep(ctx, gap)
		if ctx.Err() != nil || (i >= len(order) && time.Now().After(end)) {
			return
		}
		f.log("fault %d: %s", i+1, kind)
		if err := f.fire(ctx, kind); err != nil {
			f.fail("fault %s: %v", kind, err)
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// firstRound is the order in which every kind fires once: drawn from rnd, but for the
// kinds that act on the workload's actions, which come first, while it still runs even
// in a short run: the undeletable action, which the collector then meets through every
// other fault, and the deleted pod.
func firstRound(rnd *rand.Rand, kinds []string) []string {
	order := append([]string(nil), kinds...)
	rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for _, first := range []string{faultDeleteRunning, faultUndeletable} {
		if i := slices.Index(order, first); i > 0 {
			order = append([]string{first}, slices.Delete(order, i, i+1)...)
		}
	}
	return order
}

func (f *faults) fire(ctx context.Context, kind string) error {
	switch kind {
	case faultKillLeader:
		return f.killLeader(ctx)
	case faultKillEvents:
		return f.killService(ctx, kind, f.s.events[f.rnd.IntN(len(f.s.events))])
	case faultKillCache:
		return f.killService(ctx, kind, f.s.cache)
	case faultPostgres:
		f.count(kind)
		from := time.Now()
		err := f.s.pg.restartImmediate(ctx)
		f.record(kind, "postgres", from)
		return err
	case faultAPIServer:
		return f.restartAPIServer(ctx)
	case faultDeleteRunning:
		return f.deleteRunningPod(ctx)
	case faultSlowLink, faultNarrowLink, faultHalfOpen:
		return f.poisonLink(ctx, kind)
	case faultEventsOutage:
		return f.eventsOutage(ctx)
	case faultStallStore:
		return f.stallStore(ctx)
	case faultUndeletable:
		return f.makeUndeletable(ctx)
	}
	return fmt.Errorf("unknown fault %q", kind)
}

// killLeader kills the executor holding the lease, waits for the standby to take over,
// then starts the killed one again as the new standby.
func (f *faults) killLeader(ctx context.Context) error {
	leader, err := f.waitLeader(ctx, -1, time.Minute)
	if err != nil {
		return err
	}
	f.count(faultKillLeader)
	from := time.Now()
	defer f.record(faultKillLeader, f.s.executors[leader].Name, from)
	if err := f.s.executors[leader].Kill(30 * time.Second); err != nil {
		return err
	}
	standby := 1 - leader
	if _, err := f.waitLeader(ctx, leader, 2*time.Minute); err != nil {
		return fmt.Errorf("the standby executor-%d did not take over: %w", standby, err)
	}
	return f.s.startExecutor(ctx, leader)
}

// waitLeader waits until a replica other than not says it leads, and returns it.
func (f *faults) waitLeader(ctx context.Context, not int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for i := range f.s.executors {
			if i != not && f.s.executors[i].Running() && systemtest.IsLeader(ctx, f.s.execMetric[i]) {
				return i, nil
			}
		}
		sleep(ctx, 250*time.Millisecond)
	}
	return -1, errors.New("no executor holds the lease")
}

// isLeader reads controller-runtime's leader_election_master_status gauge.

// killService kills a service and starts it again after a short random outage.
func (f *faults) killService(ctx context.Context, kind string, p *proc) error {
	f.count(kind)
	from := time.Now()
	defer f.record(kind, p.Name, from)
	if err := p.Kill(30 * time.Second); err != nil {
		return err
	}
	sleep(ctx, time.Duration(f.rnd.IntN(3000))*time.Millisecond)
	return f.s.startService(ctx, p)
}

// restartAPIServer stops kube-apiserver, leaves it down a few seconds, and starts it on
// the same etcd. An executor that loses its lease meanwhile exits, as designed: that exit
// is the soak's doing.
func (f *faults) restartAPIServer(ctx context.Context) error {
	f.count(faultAPIServer)
	from := time.Now()
	f.mu.Lock()
	f.outageFrom = from
	f.mu.Unlock()
	f.s.cp.StopAPIServer()
	sleep(ctx, time.Duration(1000+f.rnd.IntN(5000))*time.Millisecond)
	err := f.s.cp.StartAPIServer(ctx)
	f.mu.Lock()
	// A lease lost during the outage may be noticed a little after it.
	f.outages = append(f.outages, window{from: from, to: time.Now().Add(30 * time.Second)})
	f.outageFrom = time.Time{}
	f.spans = append(f.spans, span{kind: faultAPIServer, target: "kube-apiserver", from: from, to: time.Now()})
	f.mu.Unlock()
	return err
}

// outageSince returns when the outage of the API server t falls in began (or the zero
// time when t falls in none).
func (f *faults) outageSince(t time.Time) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var since time.Time
	for _, w := range f.outages {
		if !t.Before(w.from) && !t.After(w.to) && (since.IsZero() || w.from.Before(since)) {
			since = w.from
		}
	}
	if !f.outageFrom.IsZero() && !t.Before(f.outageFrom) && (since.IsZero() || f.outageFrom.Before(since)) {
		since = f.outageFrom
	}
	return since
}

// inOutage reports whether t falls in an outage of the API server (or just after).
func (f *faults) inOutage(t time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.outages {
		if !t.Before(w.from) && !t.After(w.to) {
			return true
		}
	}
	return !f.outageFrom.IsZero() && !t.Before(f.outageFrom)
}

// deleteRunningPod deletes a running pod gracefully, as a preemption or an eviction
// would; the stand-in kubelet then ends it as terminated.
func (f *faults) deleteRunningPod(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var running []*corev1.Pod
		for _, p := range f.obs.snapshotPods() {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running = append(running, p)
			}
		}
		if len(running) > 0 {
			p := running[f.rnd.IntN(len(running))]
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := f.s.client.Delete(dctx, p, &client.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil {
				return fmt.Errorf("deleting pod %s: %w", p.Name, client.IgnoreNotFound(err))
			}
			f.count(faultDeleteRunning)
			f.mu.Lock()
			f.deleted = append(f.deleted, p.Name)
			f.spans = append(f.spans, span{kind: faultDeleteRunning, target: p.Labels[core.LabelTaskAction], from: time.Now(), to: time.Now()})
			f.mu.Unlock()
			f.log("deleted running pod %s", p.Name)
			return nil
		}
		sleep(ctx, 200*time.Millisecond)
	}
	f.log("no running pod to delete")
	return nil
}

// record notes that a fault of kind acted on target from from until now.
func (f *faults) record(kind, target string, from time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.spans = append(f.spans, span{kind: kind, target: target, from: from, to: time.Now()})
}

// snapshotSpans returns the faults' spans so far.
func (f *faults) snapshotSpans() []span {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]span(nil), f.spans...)
}

func (f *faults) count(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[kind]++
}

func (f *faults) fail(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

// supervise starts again any program that exits without the soak having caused it, so
// that the run goes on, and counts the exit against the system; an executor's exit
// during an outage of the API server is the soak's doing.
func (f *faults) supervise(ctx context.Context, p *proc, restart func(context.Context) error) {
	for ctx.Err() == nil {
		done := p.Exited()
		if done == nil {
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-done:
		}
		exits := p.ExitLog()
		last := exits[len(exits)-1]
		if last.Expected {
			continue // the fault that caused it starts it again
		}
		if strings.HasPrefix(p.Name, "executor") && f.inOutage(last.At) {
			p.Excuse(&last)
			f.log("%s exited during the API server's outage (%s); starting it again", p.Name, last.Err)
		} else {
			f.log("%s exited on its own (%s); starting it again", p.Name, last.Err)
		}
		for ctx.Err() == nil && f.inOutage(time.Now()) && !f.s.cp.APIServer.Running() {
			sleep(ctx, 200*time.Millisecond)
		}
		if err := restart(ctx); err != nil && ctx.Err() == nil {
			f.fail("restarting %s: %v", p.Name, err)
		}
	}
}
