// Package executorbench measures the executor on no-op actions against a real API server (the
// envtest control plane), with the events and cache services on, beside the ceiling
// measured in the same run against the same API server: a plain client doing the
// user's create plus one status write per action. It counts the executor's API writes
// and reconciles per action, since on this kind of machine the API server's write rate
// is what bounds throughput.
package executorbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/executor/tenancy"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/kubetest"
)

// Options size the run.
type Options struct {
	Actions  int
	Creators int
	// Workers is the executor's maxConcurrentReconciles; its configured default when 0.
	Workers int
	// ContainerActions is the size of the container scenario.
	ContainerActions int
	// UnmanagedPods and ManagedPods populate the cluster for the memory measurement.
	UnmanagedPods, ManagedPods int
	// RealNodeActions is the size of the real-node part.
	RealNodeActions int
	// FinishedActions is how many finished actions the garbage collection part collects.
	FinishedActions int
	// FlatActions is how many actions the part that samples what is kept per gone action
	// runs, in five rounds.
	FlatActions int
	// FairnessBacklog is the size of the fan-out in the scale part's fairness runs.
	FairnessBacklog int
	// ScaleRate and ScaleDuration are the scale part's sustained load.
	ScaleRate     float64
	ScaleDuration time.Duration
	// HeapProfiles, when set, is a directory where that part writes a heap profile after
	// each round.
	HeapProfiles string
	// Only runs one part: "noop", "container", "gc", "memory", "flat", "scale" or
	// "realnode"; all but flat and scale (minutes long) and realnode (which needs root)
	// when empty.
	Only string
	// FinalizerAtAdmission installs the component finalizer-at-admission for the
	// executor's scenarios: the API server puts the finalizer on each action it stores.
	FinalizerAtAdmission bool
	// CeilingRecordsHistory has the no-op actions' second baseline (the ceiling watching
	// the actions) also record each action's history with the events service before its
	// status write, as an executor sparing the finalizer must: what that guarantee costs
	// at least.
	CeilingRecordsHistory bool
	// APIServerProfile, when set, is where a CPU profile of the API server is written,
	// taken over the first executor scenario (the API server serves /debug/pprof).
	APIServerProfile string

	// dataDir holds the scenarios' inputs; the executor may read there.
	dataDir string
}

// writeCounter counts the executor's API write requests by resource.
type writeCounter struct {
	rt          http.RoundTripper
	taskActions atomic.Int64
	events      atomic.Int64
	pods        atomic.Int64
	other       atomic.Int64
}

func (w *writeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		switch {
		case strings.Contains(r.URL.Path, "/taskactions"):
			w.taskActions.Add(1)
		case strings.Contains(r.URL.Path, "/events"):
			w.events.Add(1)
		case strings.Contains(r.URL.Path, "/pods"):
			w.pods.Add(1)
		default:
			w.other.Add(1)
		}
	}
	return w.rt.RoundTrip(r)
}

// Result is one scenario's figures.
type Result struct {
	Scenario                      string
	Ceiling, Executor             float64 // actions per second
	P50, P99                      time.Duration
	TaskActionWrites, EventWrites float64 // per action
	PodWrites                     float64 // per action, the executor's
	Reconciles                    float64 // per action
	// CeilingCPU and ExecutorCPU are the CPU time per action of each process group
	// while the ceiling and the executor ran.
	CeilingCPU, ExecutorCPU benchutil.CPUUse
	// Watched is the second baseline (actions per second; zero when not measured): for
	// no-op actions the ceiling with an informer watching the actions, as every
	// controller has; for container actions a plain client making the executor's writes.
	// WatchedCPU is its CPU use.
	Watched    float64
	WatchedCPU benchutil.CPUUse
}

// cpuGroups are the processes whose CPU time the benchmark reports, in report order.
var cpuGroups = []string{"API server", "etcd", "Postgres", benchutil.SelfGroup}

// cpuMeter reads the CPU time of the control plane's processes (children of this one),
// of the Postgres cluster whose postmaster is postgres, and of this process: the
// executor, the services and the load.
func cpuMeter(postgres func(benchutil.Proc) bool) benchutil.CPUMeter {
	self := os.Getpid()
	return benchutil.CPUMeter{Groups: map[string]func(benchutil.Proc) bool{
		"API server": func(p benchutil.Proc) bool { return p.PPID == self && p.Comm == "kube-apiserver" },
		"etcd":       func(p benchutil.Proc) bool { return p.PPID == self && p.Comm == "etcd" },
		"Postgres":   postgres,
	}}
}

// measurePer runs f and returns the CPU time per action each group used meanwhile.
func measurePer(m benchutil.CPUMeter, actions int, f func() error) (benchutil.CPUUse, error) {
	use, err := m.Measure(f)
	if err != nil {
		return nil, err
	}
	return use.Per(actions), nil
}

func action(ns, name, taskType string) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "bench", Domain: "development", RunName: "r-" + ns, ActionName: name,
			TaskName: "bench." + taskType, TaskType: taskType, RunOutputBase: "mem://bench/" + ns},
	}
}

// namespace makes a namespace of project bench, the project the benchmark's actions name.
func namespace(ctx context.Context, c client.Client, name string) error {
	return c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{tenancy.DefaultProjectLabel: "bench"}}})
}

// Run performs every measurement and writes a Markdown report to w.
func Run(ctx context.Context, o Options, w, progress io.Writer) error {
	fmt.Fprintln(progress, "starting the control plane, Postgres and the services")
	env, err := kubetest.Start(kubetest.Options{TaskActions: true})
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	pg, err := benchutil.StartPostgres()
	if err != nil {
		return err
	}
	defer func() { _ = pg.Stop() }()
	meter := cpuMeter(pg.Procs)
	eventsURL, stopEvents, err := benchutil.StartService(ctx, events.Run, events.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.URL, Auth: auth.Config{Mode: auth.ModeNone}})
	if err != nil {
		return err
	}
	defer func() { _ = stopEvents() }()
	cacheURL, stopCache, err := benchutil.StartService(ctx, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.URL, Auth: auth.Config{Mode: auth.ModeNone}})
	if err != nil {
		return err
	}
	defer func() { _ = stopCache() }()
	dataDir, err := os.MkdirTemp("", "executor-bench")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dataDir) }()
	o.dataDir = dataDir

	// A first run warms the API server and etcd up, so that the first scenario's ceiling
	// is not measured cold.
	fmt.Fprintln(progress, "warming up")
	if o.Only == "realnode" {
		r, err := runRealNode(ctx, o, progress)
		if err != nil {
			return err
		}
		r.write(w)
		return nil
	}
	if o.Only == "flat" {
		r, err := runFlat(ctx, env, o, eventsURL, cacheURL, progress)
		if err != nil {
			return err
		}
		r.write(w)
		return nil
	}
	if o.Only == "scale" {
		if o.FairnessBacklog > 0 {
			f, err := runFairness(ctx, env, o, eventsURL, progress)
			if err != nil {
				return err
			}
			f.write(w)
		}
		if o.ScaleDuration <= 0 {
			return nil
		}
		s, err := runSustained(ctx, env, o, eventsURL, pg.URL, progress)
		if err != nil {
			return err
		}
		s.write(w)
		return nil
	}
	if o.Only == "memory" || o.Only == "gc" {
		o.Actions = 0 // nothing to warm up for
	}
	if _, err := runCeiling(ctx, env, Options{Actions: o.Actions / 2, Creators: o.Creators}, "core-sleep", func(*flytev1.TaskAction, int) error { return nil }, false, nil); err != nil {
		return err
	}

	type scenario struct {
		name, taskType string
		actions        int
		prepare        func(ta *flytev1.TaskAction, i int) error
		// kubelet: the actions run pods, which a stand-in kubelet finishes at once.
		kubelet bool
	}
	var noop, containers []scenario
	if o.Only == "" || o.Only == "noop" {
		noop = []scenario{
			{name: "core-sleep 0s", taskType: "core-sleep", actions: o.Actions, prepare: func(ta *flytev1.TaskAction, _ int) error {
				ta.Spec.Config = map[string]string{"duration": "0s"}
				return nil
			}},
			{name: "core-echo, cached (each a miss and a put)", taskType: "core-echo", actions: o.Actions, prepare: cachedEcho(dataDir, false)},
			{name: "core-echo, cached and serializable (each a miss that reserves, and a put that releases)", taskType: "core-echo", actions: o.Actions,
				prepare: cachedEcho(dataDir, true)},
		}
	}
	if o.Only == "" || o.Only == "container" {
		containers = []scenario{{name: "container, pods finished at once by a stand-in kubelet", taskType: "container", actions: o.ContainerActions, kubelet: true,
			prepare: func(ta *flytev1.TaskAction, _ int) error {
				ta.Spec.Container = &flytev1.ContainerSpec{Image: "busybox:1.36", Command: []string{"true"}}
				return nil
			}}}
	}
	var history *historyRecorder // the second baseline's, when it records the history
	if o.CeilingRecordsHistory {
		if history, err = newHistoryRecorder(eventsURL); err != nil {
			return err
		}
	}
	run := func(scs []scenario, secondName string) ([]Result, error) {
		var results []Result
		for _, sc := range scs {
			so := o
			so.Actions = sc.actions
			fmt.Fprintf(progress, "%s: ceiling\n", sc.name)
			ceilingOf := func() (float64, error) { return runCeiling(ctx, env, so, sc.taskType, sc.prepare, false, nil) }
			if sc.kubelet {
				ceilingOf = func() (float64, error) { return runPodCeiling(ctx, env, so, sc.taskType, sc.prepare, false) }
			}
			var ceiling float64
			ceilingCPU, err := measurePer(meter, so.Actions, func() (err error) {
				ceiling, err = ceilingOf()
				return err
			})
			if err != nil {
				return nil, err
			}
			var watched float64
			var watchedCPU benchutil.CPUUse
			second := func() (float64, error) { return runCeiling(ctx, env, so, sc.taskType, sc.prepare, true, history) }
			fmt.Fprintf(progress, "%s: %s\n", sc.name, secondName)
			if sc.kubelet {
				second = func() (float64, error) { return runPodCeiling(ctx, env, so, sc.taskType, sc.prepare, true) }
			}
			if watchedCPU, err = measurePer(meter, so.Actions, func() (err error) {
				watched, err = second()
				return err
			}); err != nil {
				return nil, err
			}
			fmt.Fprintf(progress, "%s: executor\n", sc.name)
			var r Result
			executorCPU, err := measurePer(meter, so.Actions, func() (err error) {
				r, err = runExecutor(ctx, env, so, sc.taskType, sc.prepare, eventsURL, cacheURL, sc.kubelet)
				return err
			})
			if err != nil {
				return nil, err
			}
			r.Scenario, r.Ceiling, r.CeilingCPU, r.ExecutorCPU = sc.name, ceiling, ceilingCPU, executorCPU
			r.Watched, r.WatchedCPU = watched, watchedCPU
			results = append(results, r)
		}
		return results, nil
	}
	noopSecond, noopSecondWhy := "ceiling with a watching informer", "the same ceiling with an informer watching the actions (as any controller has), which shows what watching costs on top of the writes"
	if history != nil {
		noopSecond, noopSecondWhy = "ceiling watching, recording the history first",
			"the same ceiling with an informer watching the actions, which also records each action's history with the events service before its status write (group-committed), as an executor sparing the finalizer must: what that guarantee costs at least"
	}
	containerSecondWhy := "a plain client making exactly the executor's writes (the finalizer put on and taken off, and the Queued status besides the ceiling's), which shows what the write pattern itself costs"
	if o.FinalizerAtAdmission {
		containerSecondWhy = "a plain client making exactly the executor's writes (the finalizer, put on at admission, taken off, and the Queued status besides the ceiling's), which shows what the write pattern itself costs"
	}
	// Each part runs and prints its tables; the two differ in the ceiling's writes, in
	// their second baseline, and in which writes besides the TaskAction's they count.
	for _, part := range []struct {
		scenarios     []scenario
		title         string
		ceiling, more string
		moreOf        func(Result) float64
		// second names the second baseline; secondWhy says what it shows.
		second, secondWhy string
	}{
		{noop, fmt.Sprintf("No-op actions: %d per scenario", o.Actions), "create + 1 status write", "Event writes", func(r Result) float64 { return r.EventWrites },
			noopSecond, noopSecondWhy},
		{containers, fmt.Sprintf("Container actions: %d", o.ContainerActions), "create, pod create, pod status, status write", "pod writes", func(r Result) float64 { return r.PodWrites },
			"plain client, the executor's writes", containerSecondWhy},
	} {
		if len(part.scenarios) == 0 {
			continue
		}
		results, err := run(part.scenarios, part.second)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "### %s, created by %d concurrent clients\n\n", part.title, o.Creators)
		fmt.Fprintf(w, "| scenario | ceiling: %s (actions/s) | executor (actions/s) | executor / ceiling | p50 | p99 | TaskAction writes / action | %s / action | reconciles / action |\n", part.ceiling, part.more)
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, r := range results {
			fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f%% | %s | %s | %.2f | %.2f | %.2f |\n", r.Scenario, r.Ceiling, r.Executor,
				100*r.Executor/r.Ceiling, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.TaskActionWrites, part.moreOf(r), r.Reconciles)
		}
		fmt.Fprintln(w)
		if results[0].Watched > 0 {
			fmt.Fprintf(w, "A second baseline: %s:\n\n", part.secondWhy)
			fmt.Fprintf(w, "| scenario | %s (actions/s) | executor (actions/s) | executor / that |\n", part.second)
			fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
			for _, r := range results {
				fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f%% |\n", r.Scenario, r.Watched, r.Executor, 100*r.Executor/r.Watched)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "CPU time per action, in milliseconds, while each ran (\"this process\" is the executor, the events and")
		fmt.Fprintln(w, "cache services and the clients creating the actions):")
		fmt.Fprintln(w)
		fmt.Fprintf(w, "| scenario | run | %s | total |\n", strings.Join(cpuGroups, " | "))
		fmt.Fprintf(w, "| --- | --- |%s ---: |\n", strings.Repeat(" ---: |", len(cpuGroups)))
		for _, r := range results {
			for _, run := range []struct {
				name string
				use  benchutil.CPUUse
			}{{"ceiling", r.CeilingCPU}, {part.second, r.WatchedCPU}, {"executor", r.ExecutorCPU}} {
				if run.use == nil {
					continue
				}
				fmt.Fprintf(w, "| %s | %s |", r.Scenario, run.name)
				for _, g := range cpuGroups {
					fmt.Fprintf(w, " %.2f |", millis(run.use[g]))
				}
				fmt.Fprintf(w, " %.2f |\n", millis(run.use.Total()))
			}
		}
		fmt.Fprintln(w)
	}
	if o.Only == "" || o.Only == "gc" {
		g, err := runGC(ctx, env, o, meter, eventsURL, progress)
		if err != nil {
			return err
		}
		g.write(w)
	}
	if o.Only == "" || o.Only == "memory" {
		fmt.Fprintf(progress, "memory: %d unmanaged and %d managed pods\n", o.UnmanagedPods, o.ManagedPods)
		m, err := measureMemory(ctx, env, o)
		if err != nil {
			return err
		}
		m.write(w, o)
	}
	return nil
}

// create makes o.Actions actions from o.Creators clients and reports when each call
// started.
func create(ctx context.Context, c client.Client, o Options, ns, taskType string, prepare func(*flytev1.TaskAction, int) error, after func(*flytev1.TaskAction) error) (map[string]time.Time, error) {
	return createAll(o.Actions, o.Creators, func(i int) (string, time.Time, error) {
		ta := action(ns, fmt.Sprintf("a%05d", i), taskType)
		err := prepare(ta, i)
		t := time.Now()
		if err == nil {
			err = c.Create(ctx, ta)
		}
		if err == nil && after != nil {
			err = after(ta)
		}
		return ta.Name, t, err
	})
}

// createAll runs createOne for 0..n-1 from workers goroutines and collects when each
// named object was created; a worker stops at its first error, which is returned.
func createAll(n, workers int, createOne func(i int) (name string, at time.Time, err error)) (map[string]time.Time, error) {
	var (
		mu      sync.Mutex
		started = make(map[string]time.Time, n)
		next    atomic.Int64
		first   error
		wg      sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				name, at, err := createOne(i)
				mu.Lock()
				started[name] = at
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return started, first
}

// runCeiling creates the actions with a plain client, each followed by one status write.
// With watched, an informer on the namespace's actions (as every controller has) runs
// meanwhile, and the run ends when it has seen every status write. With history, each
// action's history is recorded with the events service before its status write.
func runCeiling(ctx context.Context, env *kubetest.Env, o Options, taskType string, prepare func(*flytev1.TaskAction, int) error, watched bool, history *historyRecorder) (float64, error) {
	ns := fmt.Sprintf("ceiling-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, env.Client, ns); err != nil {
		return 0, err
	}
	var seen func() (int, error)
	if watched {
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		informers, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
		if err != nil {
			return 0, err
		}
		if _, err := informers.GetInformer(wctx, &flytev1.TaskAction{}); err != nil {
			return 0, err
		}
		go func() { _ = informers.Start(wctx) }()
		if !informers.WaitForCacheSync(wctx) {
			return 0, fmt.Errorf("ceiling: the informer did not sync")
		}
		seen = func() (int, error) {
			var list flytev1.TaskActionList
			if err := informers.List(wctx, &list, client.UnsafeDisableDeepCopy); err != nil {
				return 0, err
			}
			n := 0
			for i := range list.Items {
				if list.Items[i].Status.Phase == flytev1.PhaseSucceeded {
					n++
				}
			}
			return n, nil
		}
	}
	start := time.Now()
	_, err := create(ctx, env.Client, o, ns, taskType, prepare, func(ta *flytev1.TaskAction) error {
		ta.Status = finishedStatus(ta.Generation)
		if history != nil {
			if err := history.record(ctx, ta); err != nil {
				return err
			}
		}
		return env.Client.Status().Update(ctx, ta)
	})
	if err != nil {
		return 0, fmt.Errorf("ceiling: %w", err)
	}
	for seen != nil {
		n, err := seen()
		if err != nil {
			return 0, err
		}
		if n == o.Actions {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return 0, fmt.Errorf("ceiling: the informer saw %d of %d", n, o.Actions)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return float64(o.Actions) / time.Since(start).Seconds(), nil
}

// finishedStatus is the status the executor writes for a no-op action that finishes in
// its first pass, so that the ceiling's status write carries what the executor's does.
func finishedStatus(generation int64) flytev1.TaskActionStatus {
	now := metav1.Now()
	at := metav1.NewMicroTime(now.Time)
	condition := func(typ string, status metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, ObservedGeneration: generation, LastTransitionTime: now, Reason: flytev1.ReasonSucceeded}
	}
	return flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, Attempts: 1, ObservedGeneration: generation,
		PluginPhase: "Success", CacheStatus: flytev1.CacheDisabled, StartedAt: &now, CompletedAt: &now,
		Conditions: []metav1.Condition{condition(flytev1.ConditionProgressing, metav1.ConditionFalse), condition(flytev1.ConditionSucceeded, metav1.ConditionTrue),
			condition(flytev1.ConditionFinished, metav1.ConditionTrue), condition(flytev1.ConditionReady, metav1.ConditionTrue)},
		PhaseHistory: []flytev1.PhaseTransition{
			{Phase: flytev1.PhaseQueued, Attempt: 1, Reason: flytev1.ReasonQueued, OccurredAt: at},
			{Phase: flytev1.PhaseSucceeded, Attempt: 1, Version: 1, Reason: flytev1.ReasonSucceeded, OccurredAt: at, CacheStatus: flytev1.CacheDisabled},
		}}
}

func runExecutor(ctx context.Context, env *kubetest.Env, o Options, taskType string, prepare func(*flytev1.TaskAction, int) error, eventsURL, cacheURL string, kubelet bool) (Result, error) {
	ns := fmt.Sprintf("executor-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, env.Client, ns); err != nil {
		return Result{}, err
	}
	if o.FinalizerAtAdmission {
		remove, err := kubetest.FinalizerAtAdmission(ctx, env.Client, ns, controller.Finalizer)
		defer remove()
		if err != nil {
			return Result{}, err
		}
	}
	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL, cfg.CacheServiceURL = eventsURL, cacheURL
	cfg.GC.Interval = metav1.Duration{}
	cfg.Storage.AllowedPrefixes = []string{"file://" + o.dataDir, "mem://bench/"} // inputs, outputs
	if o.Workers > 0 {
		cfg.MaxConcurrentReconciles = o.Workers
	}
	counter := &writeCounter{}
	restConfig := rest.CopyConfig(env.Config)
	restConfig.QPS, restConfig.Burst = 1000, 2000 // the API server, not the client, should be the limit
	restConfig.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter }
	var reconciles atomic.Int64
	// An action is done when its whole history is delivered: after its last status write.
	delivered := make(chan *flytev1.TaskAction, o.Actions)
	cfg.Namespaces = []string{ns}
	_, stop, err := startExecutor(ctx, cfg, restConfig, executor.Options{
		// Each pass is counted as it starts.
		WrapReconciler: func(r reconcile.Reconciler) reconcile.Reconciler {
			return reconcile.Func(func(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
				reconciles.Add(1)
				return r.Reconcile(ctx, req)
			})
		},
		OnDelivered: func(ta *flytev1.TaskAction) { delivered <- ta },
	})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	if kubelet {
		kctx, stopKubelet := context.WithCancel(ctx)
		defer stopKubelet()
		if err := startKubelet(kctx, env, ns); err != nil {
			return Result{}, err
		}
	}
	baseTA, baseEvents, basePods := counter.taskActions.Load(), counter.events.Load(), counter.pods.Load()

	if o.APIServerProfile != "" {
		profiled := make(chan error, 1)
		go func() { profiled <- profileAPIServer(ctx, env.Config, o.APIServerProfile, 10*time.Second) }()
		defer func() {
			if err := <-profiled; err != nil {
				fmt.Fprintf(os.Stderr, "API server profile: %v\n", err)
			}
		}()
	}
	start := time.Now()
	var started map[string]time.Time
	created := make(chan error, 1)
	go func() {
		var err error
		started, err = create(ctx, env.Client, o, ns, taskType, prepare, nil)
		created <- err
	}()
	finished := make(map[string]time.Time, o.Actions)
	timeout := time.After(10 * time.Minute)
	for len(finished) < o.Actions {
		select {
		case ta := <-delivered:
			if ta.Status.Phase != flytev1.PhaseSucceeded {
				return Result{}, fmt.Errorf("%s ended %s: %+v", ta.Name, ta.Status.Phase, ta.Status.Error)
			}
			if _, seen := finished[ta.Name]; !seen {
				finished[ta.Name] = time.Now()
			}
		case <-timeout:
			return Result{}, fmt.Errorf("only %d of %d actions finished", len(finished), o.Actions)
		}
	}
	elapsed := time.Since(start)
	if err := <-created; err != nil {
		return Result{}, err
	}
	// The finalizer comes off in the pass that wrote the outcome, just after it: wait
	// for those writes before counting.
	if err := waitNoFinalizers(ctx, env.Client, ns); err != nil {
		return Result{}, err
	}
	var lat []time.Duration
	for name, t := range finished {
		lat = append(lat, t.Sub(started[name]))
	}
	n := float64(o.Actions)
	return Result{
		Executor:         n / elapsed.Seconds(),
		P50:              benchutil.Percentile(lat, 0.5),
		P99:              benchutil.Percentile(lat, 0.99),
		TaskActionWrites: float64(counter.taskActions.Load()-baseTA) / n,
		EventWrites:      float64(counter.events.Load()-baseEvents) / n,
		PodWrites:        float64(counter.pods.Load()-basePods) / n,
		Reconciles:       float64(reconciles.Load()) / n,
	}, nil
}

// profileAPIServer writes a CPU profile of the API server over d to path.
func profileAPIServer(ctx context.Context, cfg *rest.Config, path string, d time.Duration) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	data, err := cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", fmt.Sprint(int(d.Seconds()))).Timeout(d + 30*time.Second).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("fetching the profile: %w", err)
	}
	return os.WriteFile(path, data, 0o644)
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// waitNoFinalizers waits until no action in ns carries a finalizer.
func waitNoFinalizers(ctx context.Context, c client.Client, ns string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var list flytev1.TaskActionList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		held := 0
		for _, ta := range list.Items {
			if len(ta.Finalizers) > 0 {
				held++
			}
		}
		if held == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d finished actions still carry a finalizer", held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startExecutor sets an executor up as its binary does and runs it until the returned
// stop, once its cache is in sync. It runs beside the others of the process: its
// controller may share their name, and its metrics go to a registry of its own unless
// opts names one.
func startExecutor(ctx context.Context, cfg config.Config, restConfig *rest.Config, opts executor.Options) (mgr manager.Manager, stop func(), err error) {
	opts.SkipNameValidation = true
	if opts.MetricsRegistry == nil {
		opts.MetricsRegistry = prometheus.NewRegistry()
	}
	mctx, cancel := context.WithCancel(ctx)
	mgr, err = executor.Setup(mctx, cfg, restConfig, slog.New(slog.DiscardHandler), opts)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	stop = func() { cancel(); <-done }
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		stop()
		return nil, nil, fmt.Errorf("the executor's cache did not sync")
	}
	return mgr, stop, nil
}

// cachedEcho prepares a cacheable core-echo action whose inputs no other action has, so
// that each is a miss and a put.
func cachedEcho(dataDir string, serializable bool) func(ta *flytev1.TaskAction, i int) error {
	return func(ta *flytev1.TaskAction, i int) error {
		path := filepath.Join(dataDir, ta.Namespace, ta.Name+".json")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		ta.Spec.InputURI = "file://" + path
		ta.Spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: serializable}
		return os.WriteFile(path, []byte(fmt.Sprintf(`{"i": %d}`, i)), 0o644)
	}
}
