package executorbench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/test/kubetest"
)

// fairnessRow is one scenario of the fairness part: how long another namespace's
// interactive actions took while a backlog drained.
type fairnessRow struct {
	name          string
	queue         string
	backlogDrain  time.Duration // from the backlog's first create to its last delivery
	p50, p99, max time.Duration // interactive actions, create to delivered
}

type fairnessResult struct {
	backlog, interactive int
	interval             time.Duration
	workers              int // 0: the default
	rows                 []fairnessRow
}

// fairnessScenario says when the backlog is made and which queue the executor has.
type fairnessScenario struct {
	name string
	fifo bool
	// backlog: 0 none; arriving: created while the executor runs; before: created before
	// it starts.
	backlog string
}

// controllerRuntimeQueue makes the work queue controller-runtime gives a controller that
// asks for none (its priority queue, first in, first out within a priority; logging
// nothing): the baseline the fair queue is measured against.
func controllerRuntimeQueue(name string, limiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return priorityqueue.New(name, func(o *priorityqueue.Opts[reconcile.Request]) { o.RateLimiter = limiter })
}

// runFairness measures what one namespace's backlog costs another's interactive
// actions: 50 core-sleep 0s actions created one per 100 ms in one namespace while a
// fan-out of 5,000 in another is created (by o.Creators clients) and drains, with
// controller-runtime's first-in-first-out queue and with the fair one, each on a fresh
// executor; and the same interactive actions alone, the baseline.
func runFairness(ctx context.Context, env *kubetest.Env, o Options, eventsURL string, progress io.Writer) (fairnessResult, error) {
	r := fairnessResult{backlog: o.FairnessBacklog, interactive: 50, interval: 100 * time.Millisecond, workers: o.Workers}
	for _, sc := range []fairnessScenario{
		{name: "interactive alone", backlog: ""},
		{name: "fan-out arriving while the executor runs", fifo: true, backlog: "arriving"},
		{name: "fan-out arriving while the executor runs", backlog: "arriving"},
		{name: "fan-out already there when the executor starts", fifo: true, backlog: "before"},
		{name: "fan-out already there when the executor starts", backlog: "before"},
	} {
		queue := "fair"
		if sc.fifo {
			queue = "first in, first out (controller-runtime's)"
		}
		fmt.Fprintf(progress, "fairness: %s, %s queue\n", sc.name, queue)
		row, err := fairnessRun(ctx, env, r, sc, o.Workers, eventsURL)
		if err != nil {
			return r, fmt.Errorf("fairness: %s: %w", sc.name, err)
		}
		row.name, row.queue = sc.name, queue
		r.rows = append(r.rows, row)
	}
	return r, nil
}

func fairnessRun(ctx context.Context, env *kubetest.Env, r fairnessResult, sc fairnessScenario, workers int, eventsURL string) (fairnessRow, error) {
	suffix := time.Now().UnixNano() % 1e6
	batch, interactive := fmt.Sprintf("batch-%d", suffix), fmt.Sprintf("interactive-%d", suffix)
	for _, ns := range []string{batch, interactive} {
		if err := namespace(ctx, env.Client, ns); err != nil {
			return fairnessRow{}, err
		}
	}
	sleep := func(ns, name string) *flytev1.TaskAction {
		ta := action(ns, name, "core-sleep")
		ta.Spec.Config = map[string]string{"duration": "0s"}
		return ta
	}
	createBacklog := func() (time.Time, error) {
		start := time.Now()
		_, err := createAll(r.backlog, 16, func(i int) (string, time.Time, error) {
			ta := sleep(batch, fmt.Sprintf("b%05d", i))
			return ta.Name, time.Now(), env.Client.Create(ctx, ta)
		})
		return start, err
	}

	var mu sync.Mutex
	delivered := map[string]time.Time{}
	var lastBatch time.Time
	batchDone := 0
	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL = eventsURL
	cfg.GC.Interval = metav1.Duration{}
	if workers > 0 {
		cfg.MaxConcurrentReconciles = workers
	}
	restConfig := rest.CopyConfig(env.Config)
	restConfig.QPS, restConfig.Burst = 1000, 2000

	var backlogStart time.Time
	var err error
	if sc.backlog == "before" {
		if backlogStart, err = createBacklog(); err != nil {
			return fairnessRow{}, err
		}
	}
	cfg.Namespaces = []string{batch, interactive}
	var newQueue func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request]
	if sc.fifo {
		newQueue = controllerRuntimeQueue
	}
	_, stop, err := startExecutor(ctx, cfg, restConfig, executor.Options{
		NewQueue: newQueue,
		OnDelivered: func(ta *flytev1.TaskAction) {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if ta.Namespace == batch {
				batchDone++
				lastBatch = now
				return
			}
			if _, seen := delivered[ta.Name]; !seen {
				delivered[ta.Name] = now
			}
		},
	})
	if err != nil {
		return fairnessRow{}, err
	}
	defer stop()

	backlogCreated := make(chan error, 1)
	if sc.backlog == "arriving" {
		go func() {
			var err error
			backlogStart, err = createBacklog()
			backlogCreated <- err
		}()
		// The interactive actions start once the fan-out is under way.
		time.Sleep(r.interval)
	} else {
		backlogCreated <- nil
	}
	created := map[string]time.Time{}
	for i := range r.interactive {
		ta := sleep(interactive, fmt.Sprintf("i%03d", i))
		created[ta.Name] = time.Now()
		if err := env.Client.Create(ctx, ta); err != nil {
			return fairnessRow{}, err
		}
		time.Sleep(r.interval)
	}
	if err := <-backlogCreated; err != nil {
		return fairnessRow{}, err
	}
	wantBatch := r.backlog
	if sc.backlog == "" {
		wantBatch = 0
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		mu.Lock()
		n, b := len(delivered), batchDone
		mu.Unlock()
		if n >= r.interactive && b >= wantBatch {
			break
		}
		if time.Now().After(deadline) {
			return fairnessRow{}, fmt.Errorf("%d of %d interactive and %d of %d backlog actions delivered", n, r.interactive, b, wantBatch)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var lat []time.Duration
	mu.Lock()
	for name, at := range delivered {
		lat = append(lat, at.Sub(created[name]))
	}
	row := fairnessRow{p50: benchutil.Percentile(lat, 0.5), p99: benchutil.Percentile(lat, 0.99), max: benchutil.Percentile(lat, 1)}
	if wantBatch > 0 {
		row.backlogDrain = lastBatch.Sub(backlogStart)
	}
	mu.Unlock()
	// Leave an empty store to the next scenario: every action is delivered, so none
	// holds a finalizer.
	for _, ns := range []string{batch, interactive} {
		if err := env.Client.DeleteAllOf(ctx, &flytev1.TaskAction{}, client.InNamespace(ns)); err != nil {
			return row, fmt.Errorf("deleting the actions of %s: %w", ns, err)
		}
	}
	return row, nil
}

func (r fairnessResult) write(w io.Writer) {
	fmt.Fprintf(w, "### Fairness: %d interactive actions, one per %s, in one namespace while another's fan-out of %d drains\n\n",
		r.interactive, r.interval, r.backlog)
	workers := fmt.Sprintf("the default configuration: %d workers", config.Default().MaxConcurrentReconciles)
	if r.workers > 0 {
		workers = fmt.Sprintf("the default configuration but %d workers", r.workers)
	}
	fmt.Fprintf(w, "Each row a fresh executor (%s); every action a core-sleep 0s; an\n", workers)
	fmt.Fprintln(w, "interactive action's time runs from its create to the events service's acknowledgement of its")
	fmt.Fprintln(w, "last event. The fan-out is created by 16 clients.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | queue | interactive p50 | p99 | max | p99 / alone | fan-out drained in |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: |")
	alone := r.rows[0].p99
	for _, row := range r.rows {
		drain := "–"
		if row.backlogDrain > 0 {
			drain = row.backlogDrain.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.1f× | %s |\n", row.name, row.queue, row.p50.Round(time.Millisecond),
			row.p99.Round(time.Millisecond), row.max.Round(time.Millisecond), float64(row.p99)/float64(alone), drain)
	}
	fmt.Fprintln(w)
}
