package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/systemtest"
)

// Options shape a soak.
type Options struct {
	Seed uint64
	// Duration is how long faults fire and actions arrive; the system then has
	// SettleTimeout to finish what it owes.
	Duration, SettleTimeout time.Duration
	// Dir holds the binaries, configuration, data and every program's log.
	Dir string
	// Assets is the directory of the envtest binaries (etcd, kube-apiserver).
	Assets string
	// Node is where pods run: systemtest.NodeReal or systemtest.NodeStandIn (the default).
	Node string
	// FinalizerAtAdmission installs the component finalizer-at-admission for the soak's
	// namespaces: the API server puts the executor's finalizer on each action it stores.
	FinalizerAtAdmission bool
	// Log receives the soak's progress.
	Log func(format string, args ...any)
}

// Report is what a soak did and found.
type Report struct {
	Seed     uint64
	Duration time.Duration
	Actions  int
	Deleted  int
	// Hostile counts the hostile tenant's actions (hostile.go), not in Actions;
	// HostileEnds says how each ended.
	Hostile     int
	HostileEnds []string
	Faults      map[string]int
	// PodsRun counts the pods whose container ran to its end, by container runtime
	// ("" for the stand-in kubelet, which runs none).
	PodsRun map[string]int
	// Problems name every action (or process) that broke a promise; none means the
	// run passed.
	Problems []string
	// Observed says what the sampler saw: stored actions and memory at their peaks.
	Observed string
}

// FaultSummary lists the faults fired, kind by kind.
func (r *Report) FaultSummary() string {
	kinds := make([]string, 0, len(r.Faults))
	total := 0
	for k, n := range r.Faults {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d faults: %s", total, strings.Join(kinds, ", "))
}

// Run brings the system up, runs the workload under faults, waits for the system to
// settle and checks it. An error means the soak itself could not run.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.SettleTimeout == 0 {
		o.SettleTimeout = 90 * time.Second
		if o.Node == systemtest.NodeReal {
			// A real node on two cores runs about 0.5 pods a second through the API
			// server's restarts, fewer than the workload's container actions arrive:
			// pods are still queued for its CPU when the chaos ends. The checks are the
			// same; the settling stops as soon as they pass.
			o.SettleTimeout = 5 * time.Minute
		}
	}
	rep := &Report{Seed: o.Seed, Duration: o.Duration}
	ctrllog.SetLogger(logr.Discard()) // the soak's client retries through outages; its complaints are noise
	// One source per consumer, all from the seed, so that the workload does not change
	// with how many faults fired.
	workRnd := rand.New(rand.NewPCG(o.Seed, 1))
	faultRnd := rand.New(rand.NewPCG(o.Seed, 2))
	hostileRnd := rand.New(rand.NewPCG(o.Seed, 3))

	o.Log("starting the system in %s", o.Dir)
	s, err := startSystem(ctx, o.Dir, o.Assets, o.Node, o.Log)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	if o.FinalizerAtAdmission {
		for _, ns := range []string{taskNamespace, hostileNamespace} {
			remove, err := kubetest.FinalizerAtAdmission(ctx, s.client, ns, controller.Finalizer)
			defer remove()
			if err != nil {
				return nil, err
			}
		}
		o.Log("the finalizer is put on at admission")
	}
	w, err := planWorkload(workRnd, o.Duration, s.dataDir, s.image())
	if err != nil {
		return nil, err
	}
	rep.Actions = len(w.plans)
	hostile, err := planHostile(hostileRnd, o.Duration, w.plans, s.dataDir, s.image())
	if err != nil {
		return nil, err
	}
	rep.Hostile = len(hostile)
	for _, p := range hostile {
		w.plans = append(w.plans, p)
		w.byName[p.name] = p
	}
	if err := setUpHostile(ctx, s.client, s.image()); err != nil {
		return nil, err
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopRun()
	obs := newObserver()
	for _, ns := range []string{taskNamespace, hostileNamespace} {
		bg.Go(func() {
			follow(runCtx, s.client, ns, func() client.ObjectList { return &flytev1.TaskActionList{} }, obs.action)
		})
		bg.Go(func() { follow(runCtx, s.client, ns, func() client.ObjectList { return &corev1.PodList{} }, obs.pod) })
	}
	if s.node == nil {
		k := systemtest.NewKubelet(s.client, obs.snapshotPods, o.Seed, w.exitCode, w.leave)
		bg.Go(func() { k.Run(runCtx) })
	}
	f := newFaults(s, obs, faultRnd, o.Log)
	f.long = o.Duration >= 2*time.Minute
	f.kept = func(name string) bool {
		p := w.byName[name]
		return p != nil && !p.hostile && p.deletion == keep
	}
	for i, e := range s.executors {
		bg.Go(func() { f.supervise(runCtx, e, func(ctx context.Context) error { return s.startExecutor(ctx, i) }) })
	}
	for _, p := range s.services() {
		bg.Go(func() { f.supervise(runCtx, p, func(ctx context.Context) error { return s.startService(ctx, p) }) })
	}
	sm := newSampler(s, f)
	bg.Go(func() { sm.run(runCtx) })
	ws := newWatchers()
	for i, url := range s.eventsURLs {
		for _, project := range []string{"chaos", hostileProject} {
			bg.Go(func() { ws.follow(runCtx, s.watchClient, s.events[i].Name, url, project) })
		}
	}

	o.Log("chaos for %s: %d actions, %d of them the hostile tenant's, faults at random", o.Duration, len(w.plans), rep.Hostile)
	chaosCtx, stopChaos := context.WithTimeout(runCtx, o.Duration+5*time.Minute) // faults in progress may finish
	var chaos sync.WaitGroup
	chaos.Go(func() { w.run(chaosCtx, s.client, obs) })
	chaos.Go(func() { f.run(chaosCtx, o.Duration) })
	chaos.Wait()
	stopChaos()

	o.Log("chaos over; waiting up to %s for the system to settle", o.SettleTimeout)
	ch := &checker{s: s, w: w, obs: obs, f: f, sm: sm, ws: ws}
	rep.Problems = ch.settle(ctx, o.SettleTimeout)
	rep.Observed = sm.summary() + "; closest to its fault-cost bound: " + systemtest.PhaseOrNone(ch.tightest)
	f.mu.Lock()
	rep.Faults = map[string]int{}
	for k, n := range f.counts {
		rep.Faults[k] = n
	}
	f.mu.Unlock()
	for _, p := range w.plans {
		if r, ok := obs.record(p.name); p.hostile && ok && r.last != nil {
			code := ""
			if e := r.last.Status.Error; e != nil {
				code = e.Code
			}
			rep.HostileEnds = append(rep.HostileEnds, fmt.Sprintf("%s %s %s (%d history entries)", p.name, r.last.Status.Phase, code, len(r.last.Status.PhaseHistory)))
		}
	}
	w.mu.Lock()
	rep.Deleted = len(w.deleted)
	w.mu.Unlock()
	obs.mu.Lock()
	rep.PodsRun = maps.Clone(obs.ran)
	obs.mu.Unlock()
	if s.node != nil && rep.PodsRun["containerd"] == 0 {
		rep.Problems = append(rep.Problems, "no pod ran to its end on the real node's containerd")
	}
	for _, kind := range f.kinds {
		if rep.Faults[kind] == 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("fault %s never fired (the run was too short or found nothing to hit)", kind))
		}
	}
	return rep, nil
}
