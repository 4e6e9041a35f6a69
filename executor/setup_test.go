package executor_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/executor/fairqueue"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
)

var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env, kubetest.Options{TaskActions: true})) }

func testConfig() config.Config {
	cfg := config.Default()
	cfg.MetricsBindAddress = "0" // no listeners in tests
	cfg.HealthProbeBindAddress = "0"
	cfg.GC.Interval = metav1.Duration{}
	cfg.EventsServiceURL = "" // events are tested with the controller
	cfg.CacheServiceURL = ""
	return cfg
}

// run starts an executor restricted to namespace until the test ends; its reconciles
// are counted in count.
func run(t *testing.T, cfg config.Config, namespace string, count *atomic.Int64) context.CancelFunc {
	t.Helper()
	return runWith(t, cfg, namespace, count)
}

// runWith is run with extra plugins.
func runWith(t *testing.T, cfg config.Config, namespace string, count *atomic.Int64, plugins ...core.Entry) context.CancelFunc {
	t.Helper()
	stop, _ := start(t, cfg, namespace, runOptions{count: count, plugins: plugins})
	return stop
}

// runOptions shape an executor started by a test.
type runOptions struct {
	count   *atomic.Int64
	plugins []core.Entry
	// restConfig replaces the test API server's admin config (to count requests).
	restConfig *rest.Config
	// alsoNamespaces are watched beside the namespace.
	alsoNamespaces []string
	// observe is called at the start of every reconcile.
	observe func(ctrl.Request)
	// promoteAfter replaces the work queue's PromoteAfter (its queue records no metrics).
	promoteAfter time.Duration
	// registry receives the executor's metrics, for the test to read.
	registry prometheus.Registerer
	// clock replaces the executor's clock.
	clock clock.PassiveClock
}

// inProcess is what an executor run beside others in the test's process needs: a
// controller that may share its name, and a metrics registry of its own.
func inProcess() executor.Options {
	return executor.Options{SkipNameValidation: true, MetricsRegistry: prometheus.NewRegistry()}
}

// start runs an executor restricted to namespace (unless cfg names its namespaces) until
// the test ends and returns how to stop it and its manager.
func start(t *testing.T, cfg config.Config, namespace string, o runOptions) (context.CancelFunc, manager.Manager) {
	t.Helper()
	restConfig := o.restConfig
	if restConfig == nil {
		restConfig = env.Config
	}
	if len(cfg.Namespaces) == 0 {
		cfg.Namespaces = append([]string{namespace}, o.alsoNamespaces...)
	}
	opts := inProcess()
	opts.Plugins, opts.Clock = o.plugins, o.clock
	if o.registry != nil {
		opts.MetricsRegistry = o.registry
	}
	// Each pass is counted and observed as it starts.
	opts.WrapReconciler = func(r reconcile.Reconciler) reconcile.Reconciler {
		return reconcile.Func(func(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
			if o.count != nil {
				o.count.Add(1)
			}
			if o.observe != nil {
				o.observe(req)
			}
			return r.Reconcile(ctx, req)
		})
	}
	if o.promoteAfter > 0 {
		opts.NewQueue = controller.NamespaceFairQueue(fairqueue.Options[reconcile.Request]{
			Weight: func(ns string) int { return cfg.QueueWeights[ns] }, PromoteAfter: o.promoteAfter})
	}
	mgr, stop := kubetest.RunManager(t, func(ctx context.Context) (manager.Manager, error) {
		return executor.Setup(ctx, cfg, restConfig, slog.New(slog.DiscardHandler), opts)
	})
	return stop, mgr
}

// createActions creates n actions, the ith made by newAction(i).
func createActions(t *testing.T, n int, newAction func(i int) *flytev1.TaskAction) []*flytev1.TaskAction {
	t.Helper()
	actions := make([]*flytev1.TaskAction, n)
	for i := range actions {
		actions[i] = newAction(i)
		if err := env.Client.Create(context.Background(), actions[i]); err != nil {
			t.Fatal(err)
		}
	}
	return actions
}

func waitSucceeded(t *testing.T, key client.ObjectKey) *flytev1.TaskAction {
	t.Helper()
	var ta flytev1.TaskAction
	eventually.True(t, time.Minute, func() bool {
		return env.Client.Get(context.Background(), key, &ta) == nil && ta.Status.Phase == flytev1.PhaseSucceeded
	}, func() string { return fmt.Sprintf("%s did not succeed; status %+v", key, ta.Status) })
	return &ta
}

// TestHandWrittenYAMLRunsToSucceeded applies the sample a user would write by hand.
func TestHandWrittenYAMLRunsToSucceeded(t *testing.T) {
	ns := env.Namespace(t)
	var count atomic.Int64
	run(t, testConfig(), ns, &count)

	var ta flytev1.TaskAction
	if err := repo.ReadYAML(&ta, "deploy", "samples", "taskaction-sleep.yaml"); err != nil {
		t.Fatal(err)
	}
	ta.Namespace = ns
	if err := env.Client.Create(context.Background(), &ta); err != nil {
		t.Fatal(err)
	}
	got := waitSucceeded(t, client.ObjectKeyFromObject(&ta))
	if took := got.Status.CompletedAt.Sub(got.CreationTimestamp.Time); took < 2*time.Second || took > 10*time.Second {
		t.Fatalf("a 2s sleep took %s", took)
	}
}

// TestOnlyTheLeaderReconciles runs two executors with leader election: only the leader
// reconciles, and the other takes over when the leader stops.
func TestOnlyTheLeaderReconciles(t *testing.T) {
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.LeaderElect = true
	cfg.LeaderElectionNamespace = ns
	create := func(name string) client.ObjectKey {
		ta := &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: name,
				TaskName: "demo.echo", TaskType: "core-echo", RunOutputBase: "mem://out/r1"},
		}
		if err := env.Client.Create(context.Background(), ta); err != nil {
			t.Fatal(err)
		}
		return client.ObjectKeyFromObject(ta)
	}

	var first, second atomic.Int64
	stopFirst := run(t, cfg, ns, &first)
	waitSucceeded(t, create("a0")) // the first is alone: it leads
	run(t, cfg, ns, &second)
	for _, name := range []string{"a1", "a2", "a3"} {
		waitSucceeded(t, create(name))
	}
	if second.Load() != 0 {
		t.Fatalf("the follower reconciled %d times", second.Load())
	}

	stopFirst() // releases the lease on the way out
	waitSucceeded(t, create("after-handover"))
	if second.Load() == 0 {
		t.Fatal("the second executor never took over")
	}
}
