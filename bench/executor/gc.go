package executorbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/test/kubetest"
)

// gcResult is what collecting many finished actions cost.
type gcResult struct {
	finished int
	// redelivery: from the executor's start until every finished action's history was
	// delivered again (what a restart costs before anything may be collected).
	redelivery time.Duration
	// walk is the collector's pass over the cache; collect the whole collection.
	walk, collect time.Duration
	deleted       int
	// requests is every API request the executor made while collecting, per deleted
	// action; deletes the DELETE requests among them.
	requests, deletes float64
	cpu               benchutil.CPUUse
	// idle and busy are the latencies of probe actions run before and during the
	// collection (created, finished, delivered).
	idle, busy []time.Duration
}

// requestCounter counts every request.
type requestCounter struct {
	rt      http.RoundTripper
	all     atomic.Int64
	deletes atomic.Int64
}

func (c *requestCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.all.Add(1)
	if r.Method == http.MethodDelete {
		c.deletes.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// probes is how many no-op actions measure the work queue's delay, one every 50 ms.
const probes = 60

// runGC fills a namespace with finished actions (as a plain client would write them:
// created, then a Succeeded status that finished two hours ago), starts the executor
// (which delivers their histories again, as after a restart), then collects them all
// while probe actions run, and measures the collection.
func runGC(ctx context.Context, env *kubetest.Env, o Options, meter benchutil.CPUMeter, eventsURL string, progress io.Writer) (gcResult, error) {
	res := gcResult{finished: o.FinishedActions}
	ns := fmt.Sprintf("gc-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, env.Client, ns); err != nil {
		return res, err
	}
	fmt.Fprintf(progress, "garbage collection: writing %d finished actions\n", o.FinishedActions)
	finishedAt := metav1.NewTime(time.Now().Add(-2 * time.Hour))
	fill := Options{Actions: o.FinishedActions, Creators: o.Creators * 2}
	if _, err := create(ctx, env.Client, fill, ns, "core-sleep", func(*flytev1.TaskAction, int) error { return nil }, func(ta *flytev1.TaskAction) error {
		ta.Status = flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, Attempts: 1, CompletedAt: &finishedAt,
			PhaseHistory: []flytev1.PhaseTransition{{Phase: flytev1.PhaseSucceeded, Attempt: 1, Reason: flytev1.ReasonSucceeded, OccurredAt: metav1.NewMicroTime(finishedAt.Time)}}}
		return env.Client.Status().Update(ctx, ta)
	}); err != nil {
		return res, err
	}

	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL = eventsURL
	cfg.GC.Interval = metav1.Duration{} // collected below, by a collector the benchmark drives
	counter := &requestCounter{}
	restConfig := rest.CopyConfig(env.Config)
	restConfig.QPS, restConfig.Burst = 1000, 2000
	restConfig.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter }
	var (
		mu        sync.Mutex
		delivered = map[types.UID]time.Time{}
	)
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	started := time.Now()
	cfg.Namespaces = []string{ns}
	mgr, err := executor.Setup(mctx, cfg, restConfig, slog.New(slog.DiscardHandler), executor.Options{
		SkipNameValidation: true, MetricsRegistry: prometheus.NewRegistry(),
		OnDelivered: func(ta *flytev1.TaskAction) {
			mu.Lock()
			delivered[ta.UID] = time.Now()
			mu.Unlock()
		},
	})
	if err != nil {
		return res, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() { stop(); <-done }()
	fmt.Fprintln(progress, "garbage collection: the executor delivers every history again")
	deliveredCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered)
	}
	for deliveredCount() < o.FinishedActions {
		if time.Since(started) > 10*time.Minute {
			return res, fmt.Errorf("only %d of %d histories delivered again", deliveredCount(), o.FinishedActions)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.redelivery = time.Since(started)

	gc := controller.NewGarbageCollector(mgr.GetCache(), mgr.GetClient(), controller.GarbageCollectorOptions{MaxTTL: time.Hour,
		Clock: clock.RealClock{}, Log: slog.New(slog.DiscardHandler), Delivered: func(ta *flytev1.TaskAction) bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := delivered[ta.UID]
			return ok
		}})
	probe := func(prefix string) ([]time.Duration, error) {
		fmt.Fprintf(progress, "garbage collection: %d probe actions (%s)\n", probes, prefix)
		var lat []time.Duration
		var names []string
		created := map[string]time.Time{}
		for i := range probes {
			ta := action(ns, fmt.Sprintf("%s-%03d", prefix, i), "core-sleep")
			ta.Spec.Config = map[string]string{"duration": "0s"}
			created[ta.Name] = time.Now()
			if err := env.Client.Create(ctx, ta); err != nil {
				return nil, err
			}
			names = append(names, ta.Name)
			time.Sleep(50 * time.Millisecond)
		}
		deadline := time.Now().Add(5 * time.Minute)
		for _, name := range names {
			for {
				var ta flytev1.TaskAction
				err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &ta)
				mu.Lock()
				at, ok := delivered[ta.UID]
				mu.Unlock()
				if err == nil && ok {
					lat = append(lat, at.Sub(created[name]))
					break
				}
				if time.Now().After(deadline) {
					return nil, fmt.Errorf("probe %s never finished", name)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		return lat, nil
	}
	if res.idle, err = probe("idle"); err != nil {
		return res, err
	}

	fmt.Fprintln(progress, "garbage collection: collecting")
	baseAll, baseDeletes := counter.all.Load(), counter.deletes.Load()
	busy := make(chan error, 1)
	go func() {
		var err error
		res.busy, err = probe("busy")
		busy <- err
	}()
	var c controller.Collection
	res.cpu, err = meter.Measure(func() error {
		begun := time.Now()
		var err error
		c, err = gc.Collect(ctx)
		res.collect = time.Since(begun)
		return err
	})
	if err != nil {
		return res, err
	}
	if err := <-busy; err != nil {
		return res, err
	}
	res.walk, res.deleted = c.Walk, c.Deleted
	if c.Deleted == 0 {
		return res, fmt.Errorf("the collector deleted nothing (%d kept undelivered)", c.Undelivered)
	}
	n := float64(c.Deleted)
	res.requests = float64(counter.all.Load()-baseAll) / n
	res.deletes = float64(counter.deletes.Load()-baseDeletes) / n
	res.cpu = res.cpu.Per(c.Deleted)
	return res, nil
}

func (g gcResult) write(w io.Writer) {
	fmt.Fprintf(w, "### Garbage collection of %d finished actions\n\n", g.finished)
	fmt.Fprintln(w, "| what | figure |")
	fmt.Fprintln(w, "| --- | ---: |")
	fmt.Fprintf(w, "| their histories delivered again after the executor started | %s (%.0f actions/s) |\n",
		g.redelivery.Round(time.Millisecond), float64(g.finished)/g.redelivery.Seconds())
	fmt.Fprintf(w, "| the collector's walk over the cached actions | %s |\n", g.walk.Round(time.Microsecond))
	fmt.Fprintf(w, "| the whole collection | %s for %d deleted (%.0f deletes/s) |\n", g.collect.Round(time.Millisecond), g.deleted, float64(g.deleted)/g.collect.Seconds())
	fmt.Fprintf(w, "| API requests per deleted action (all the executor made meanwhile) | %.2f (DELETE: %.2f) |\n", g.requests, g.deletes)
	fmt.Fprintf(w, "| CPU per deleted action: API server, etcd, this process (ms) | %.2f, %.2f, %.2f |\n",
		millis(g.cpu["API server"]), millis(g.cpu["etcd"]), millis(g.cpu[benchutil.SelfGroup]))
	fmt.Fprintf(w, "| probe no-op actions, before the collection: p50, p99 | %s, %s |\n",
		benchutil.Percentile(g.idle, 0.5).Round(time.Millisecond), benchutil.Percentile(g.idle, 0.99).Round(time.Millisecond))
	fmt.Fprintf(w, "| probe no-op actions, during it: p50, p99 | %s, %s |\n",
		benchutil.Percentile(g.busy, 0.5).Round(time.Millisecond), benchutil.Percentile(g.busy, 0.99).Round(time.Millisecond))
	fmt.Fprintln(w)
}
