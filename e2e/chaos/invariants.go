package chaos

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/systemtest"
)

// Settings of the soak's executors that its invariants hold them to.
const (
	// The collector: a pass every 2 s, finished actions kept 10 s once delivered, at
	// most 20 finished held in all and in each namespace. Short and small, so that an
	// events outage outlasts the TTL within a run and the bound binds.
	soakGCInterval  = 2 * time.Second
	soakGCTTL       = 10 * time.Second
	soakMaxFinished = 20
	// soakMaxUndeliveredFinished is eventsBacklog.maxUndeliveredFinished: past it, new
	// actions wait while the events service is away.
	soakMaxUndeliveredFinished = 10
	// soakStoreCallTimeout is storage.callTimeout, shorter than a stall of the store.
	soakStoreCallTimeout = 3 * time.Second
)

// memoryLimits bound each program's resident memory (VmRSS) over a run, by the name of
// its process up to the replica's number. Measured peaks on the stand-in in 5-minute
// runs were well under half of each (docs/reliability.md); a program over its limit is
// growing with what it has seen, not with what it holds.
var memoryLimits = map[string]int64{
	"executor":       256 << 20,
	"events":         192 << 20,
	"cacheservice":   160 << 20,
	"etcd":           512 << 20,
	"kube-apiserver": 1536 << 20,
}

// sampler watches the system while it runs: how many TaskActions are stored, finished
// and started (the bound on stored actions), and every program's resident memory.
type sampler struct {
	s *system
	f *faults

	mu sync.Mutex
	// finishedAt is when a sample first showed each action finished.
	finishedAt map[string]time.Time
	// startedMax is the most actions seen started (not queued, not finished) at once.
	startedMax int
	peakStored int
	violations []string
	// over counts the samples over the bound, peakOver by how much at most, lastOver
	// when the last was.
	over, peakOver int
	lastOver       time.Time
	// rss is each program's peak resident memory and when it was seen.
	rss     map[string]int64
	rssWhen map[string]time.Time
	samples int
}

func newSampler(s *system, f *faults) *sampler {
	return &sampler{s: s, f: f, finishedAt: map[string]time.Time{}, rss: map[string]int64{}, rssWhen: map[string]time.Time{}}
}

// run samples every second until ctx ends.
func (sm *sampler) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sm.sampleActions(ctx)
		sm.sampleMemory()
	}
}

// storedBound is the most finished actions the executors may hold at t:
//
//	gc.maxFinished + eventsBacklog.maxUndeliveredFinished + startedMax + recent
//
// gc.maxFinished finished actions are held once delivered (the undelivered count against
// it, but are never deleted); while the events service is away, at most
// maxUndeliveredFinished more, since new actions wait once that many are undelivered,
// plus the actions already started then, which still finish (startedMax, the most seen
// started at once); recent are those that finished within the last collector pass
// (gc.interval and a second), which the collector has not yet seen, or, while the API
// server is away or just back (the outage and 30 s after, in which a leader may change),
// since the outage began: the collector cannot delete meanwhile. Actions not yet
// finished are the workload's demand, which no setting bounds: the bound is on what the
// system keeps of finished work.
func storedBound(startedMax, recent int) int {
	return soakMaxFinished + soakMaxUndeliveredFinished + startedMax + recent
}

func (sm *sampler) sampleActions(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var list flytev1.TaskActionList
	if err := sm.s.client.List(lctx, &list); err != nil {
		return // the API server is away: the next sample
	}
	now := time.Now()
	finished, started := 0, 0
	var held []string
	for i := range list.Items {
		ta := &list.Items[i]
		if ta.Namespace != taskNamespace && ta.Namespace != hostileNamespace {
			continue
		}
		key := ta.Namespace + "/" + ta.Name + "/" + string(ta.UID)
		switch ph := ta.Status.Phase; {
		case ph.IsTerminal():
			finished++
			held = append(held, ta.Name)
			sm.mu.Lock()
			if _, ok := sm.finishedAt[key]; !ok {
				sm.finishedAt[key] = now
			}
			sm.mu.Unlock()
		case ph != "" && ph != flytev1.PhaseQueued:
			started++
		}
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.samples++
	sm.startedMax = max(sm.startedMax, started)
	sm.peakStored = max(sm.peakStored, len(list.Items))
	since := now.Add(-soakGCInterval - time.Second)
	if from := sm.f.outageSince(now); !from.IsZero() && from.Before(since) {
		since = from
	}
	recent := 0
	for _, at := range sm.finishedAt {
		if !at.Before(since) {
			recent++
		}
	}
	if bound := storedBound(sm.startedMax, recent); finished > bound {
		sm.over++
		sm.lastOver = now
		sm.peakOver = max(sm.peakOver, finished-bound)
		if len(sm.violations) > 0 {
			return
		}
		sort.Strings(held)
		if len(held) > 8 {
			held = append(held[:8], "…")
		}
		sm.violations = append(sm.violations, fmt.Sprintf(
			"stored-actions bound: at %s %d finished actions were stored (%d in all), over the bound of %d (gc.maxFinished %d + eventsBacklog.maxUndeliveredFinished %d + %d started at most + %d finished within the last collector pass or since the API server went away); among them %s",
			now.Format(time.TimeOnly), finished, len(list.Items), bound, soakMaxFinished, soakMaxUndeliveredFinished, sm.startedMax, recent, strings.Join(held, " ")))
	}
}

// sampleMemory reads each running program's VmRSS.
func (sm *sampler) sampleMemory() {
	for _, p := range sm.s.allProcs() {
		pid := p.Pid()
		if pid == 0 {
			continue
		}
		raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				if err != nil {
					break
				}
				sm.mu.Lock()
				if kb<<10 > sm.rss[p.Name] {
					sm.rss[p.Name], sm.rssWhen[p.Name] = kb<<10, time.Now()
				}
				sm.mu.Unlock()
			}
		}
	}
}

// memoryProblems names every program whose peak went over its limit.
func (sm *sampler) memoryProblems() []string {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var out []string
	for name, peak := range sm.rss {
		limit := memoryLimits[programOf(name)]
		if limit > 0 && peak > limit {
			out = append(out, fmt.Sprintf("memory limit: %s reached %d MiB resident at %s, over its limit of %d MiB",
				name, peak>>20, sm.rssWhen[name].Format(time.TimeOnly), limit>>20))
		}
	}
	return out
}

// Summary says what the sampler saw: the peaks against their bounds.
func (sm *sampler) summary() string {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var mem []string
	for name, peak := range sm.rss {
		mem = append(mem, fmt.Sprintf("%s %d MiB", name, peak>>20))
	}
	sort.Strings(mem)
	return fmt.Sprintf("%d samples; at most %d actions stored, %d started at once; peak memory: %s",
		sm.samples, sm.peakStored, sm.startedMax, strings.Join(mem, ", "))
}

// boundProblems name the first sample over the bound on stored actions, and how many
// more were.
func (sm *sampler) boundProblems() []string {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if len(sm.violations) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%s; %d samples in all were over the bound, by up to %d, the last at %s",
		sm.violations[0], sm.over, sm.peakOver, sm.lastOver.Format(time.TimeOnly))}
}

// programOf is a process's program: its name without the replica's number.
func programOf(name string) string {
	if i := strings.LastIndex(name, "-"); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			return name[:i]
		}
	}
	return name
}

// Fault cost: each fault costs at most the work it touches. A core action that is not
// cached (sleep, sleep-retry, echo) needs no node and no reservation, so its time from
// create to end is bounded by
//
//	costBase + its own work + the faults that touch it while it lives, each for its span
//	and costRecovery after
//
// where a fault touches it unless it acts on something the action does not use: the
// cache service (a kill, any link fault on the cache), another action (delete-pod,
// undeletable), and, for a sleep, the data store (stall-store).
const (
	costBase     = 30 * time.Second
	costRecovery = 15 * time.Second
)

// touches says a fault's span may delay an action of kind named name.
func touches(sp span, kind, name string) bool {
	switch {
	case sp.kind == faultKillCache, sp.target == linkCache:
		return false
	case sp.kind == faultDeleteRunning, sp.kind == faultUndeletable:
		return sp.target == name
	case sp.kind == faultStallStore:
		return kind != kindSleep && kind != kindSleepRetry
	}
	return true
}

// costProblems holds each measured action to its bound.
func (ch *checker) costProblems() []string {
	spans := ch.f.snapshotSpans()
	ch.w.mu.Lock()
	createdAt := make(map[string]time.Time, len(ch.w.createdAt))
	for k, v := range ch.w.createdAt {
		createdAt[k] = v
	}
	ch.w.mu.Unlock()
	var out []string
	for _, p := range ch.w.plans {
		if p.hostile || p.deletion != keep || (p.kind != kindSleep && p.kind != kindSleepRetry && p.kind != kindEcho) {
			continue
		}
		r, ok := ch.obs.record(p.name)
		created, wasCreated := createdAt[p.name]
		if !ok || !wasCreated || r.endedAt.IsZero() {
			continue // not finished: another check names it
		}
		work := time.Duration(0)
		if d, err := time.ParseDuration(p.action.Spec.Config["duration"]); err == nil {
			work = d * time.Duration(1+p.action.Spec.Retries)
		}
		if p.action.Spec.Retries > 0 {
			work += 2 * time.Second // retryBackoff.cap
		}
		bound := costBase + work
		var faults []string
		for _, sp := range spans {
			if sp.to.Before(created) || sp.from.After(r.endedAt) || !touches(sp, p.kind, p.name) {
				continue
			}
			bound += sp.to.Sub(sp.from) + costRecovery
			faults = append(faults, fmt.Sprintf("%s %s %s–%s", sp.kind, sp.target, sp.from.Format(time.TimeOnly), sp.to.Format(time.TimeOnly)))
		}
		took := r.endedAt.Sub(created)
		if ratio := float64(took) / float64(bound); ratio > ch.tightestRatio {
			ch.tightestRatio = ratio
			ch.tightest = fmt.Sprintf("%s took %s of its %s", p.name, took.Round(time.Second), bound.Round(time.Second))
		}
		if took > bound {
			out = append(out, fmt.Sprintf("fault cost: %s took %s from create to end, over its bound of %s (%s base + %s work + the faults touching it: %s)",
				p.name, took.Round(time.Second), bound.Round(time.Second), costBase, work, systemtest.PhaseOrNone(strings.Join(faults, ", "))))
		}
	}
	return out
}

// collectionProblems holds the collector to going on past an action it cannot delete:
// every finished chaos action the client keeps, seen finished more than gc.maxTTL and
// a margin ago, is gone, but for those made undeletable, which must still be there.
func (ch *checker) collectionProblems(ctx context.Context) []string {
	ch.f.mu.Lock()
	undeletable := make(map[string]bool, len(ch.f.undeletable))
	for k := range ch.f.undeletable {
		undeletable[k] = true
	}
	ch.f.mu.Unlock()
	var out []string
	margin := soakGCTTL + 5*soakGCInterval + 10*time.Second
	for _, p := range ch.w.plans {
		if p.hostile || p.deletion != keep {
			continue
		}
		r, ok := ch.obs.record(p.name)
		if !ok {
			continue
		}
		switch {
		case undeletable[p.name]:
			var ta flytev1.TaskAction
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := ch.s.client.Get(cctx, client.ObjectKey{Namespace: taskNamespace, Name: p.name}, &ta)
			cancel()
			if err != nil {
				out = append(out, fmt.Sprintf("undeletable: %s, which the API server refuses to delete, could not be read (%v): the policy did not hold it", p.name, err))
			}
		case !r.gone && !r.endedAt.IsZero() && time.Since(r.endedAt) > margin:
			held := make([]string, 0, len(undeletable))
			for k := range undeletable {
				held = append(held, k)
			}
			sort.Strings(held)
			out = append(out, fmt.Sprintf("collection stuck: %s finished %s ago and is still stored (gc.maxTTL %s); undeletable: %s",
				p.name, time.Since(r.endedAt).Round(time.Second), soakGCTTL, systemtest.PhaseOrNone(strings.Join(held, " "))))
		}
	}
	return out
}
