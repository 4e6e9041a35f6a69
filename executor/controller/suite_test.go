package controller_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/eventsink"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/plugins/core/echo"
	"github.com/flytekube/backend/executor/plugins/core/sleep"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/backoff"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
)

var (
	env        *kubetest.Env
	eventsSvc  *eventsService
	reconciles sync.Map // "namespace/name" -> *int64 under countMu
	countMu    sync.Mutex
	calls      = &callLog{seen: map[string][]string{}}
)

const maxSystemFailures = 2

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "flyte-data")
	if err != nil {
		panic(err)
	}
	dataDir = dir
	code := kubetest.Main(m, &env, kubetest.Options{TaskActions: true}, startServices, startManager)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// dataDir holds the actions' inputs and outputs (file:// URIs).
var dataDir string

// storagePrefixes are where the executor lets actions read and write.
func storagePrefixes() []string {
	return []string{"file://" + dataDir, "file://" + dataDir + "/projects/{project}/{domain}", "mem://outputs/"}
}

// startServices runs real events and cache services on a real Postgres for the package;
// the events service on an address that survives its restarts.
func startServices(*kubetest.Env) (func(), error) {
	pg, err := pgtest.Start()
	if err != nil {
		return nil, err
	}
	eventsSvc = &eventsService{addr: "127.0.0.1:0", dbURL: pg.URL}
	if err := eventsSvc.start(); err != nil {
		return nil, err
	}
	ctx, stopCache := context.WithCancel(context.Background())
	started := make(chan app.Addrs, 1)
	cacheDone := make(chan error, 1)
	go func() {
		cacheDone <- cacheservice.Run(ctx, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.URL, MaxHeartbeat: time.Second, Auth: auth.Config{Mode: auth.ModeNone}},
			slog.New(slog.DiscardHandler), func(a app.Addrs) { started <- a })
	}()
	select {
	case a := <-started:
		cacheURL = "http://" + a.RPC.String()
	case err := <-cacheDone:
		stopCache()
		return nil, err
	}
	return func() { stopCache(); <-cacheDone; eventsSvc.stop(); _ = pg.Stop() }, nil
}

// cacheURL is where the cache service listens.
var cacheURL string

// eventsService is the events service, stoppable and restartable on the same address:
// the first start takes the port the kernel gives, and a restart binds that port again.
// While the service is down its port is free, and a connection on the loopback could take
// it as its own local port; then the restart fails, saying the address is in use. Only
// an outage test stops the service, for a few seconds.
type eventsService struct {
	addr, dbURL string
	mu          sync.Mutex
	cancel      context.CancelFunc
	done        chan error
}

func (e *eventsService) start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan app.Addrs, 1)
	e.cancel, e.done = cancel, make(chan error, 1)
	cfg := events.Config{Listen: e.addr, DatabaseURL: e.dbURL, Auth: auth.Config{Mode: auth.ModeNone}}
	go func() {
		e.done <- events.Run(ctx, cfg, slog.New(slog.DiscardHandler), func(a app.Addrs) { started <- a })
	}()
	select {
	case a := <-started:
		e.addr = a.RPC.String() // where a restart listens
		return nil
	case err := <-e.done:
		return err
	}
}

func (e *eventsService) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cancel != nil {
		e.cancel()
		<-e.done
		e.cancel = nil
	}
}

func (e *eventsService) client() eventsv1connect.EventsServiceClient {
	c, err := eventsink.NewClient("http://"+e.addr, rpcclient.Options{})
	if err != nil {
		panic(err) // no files to read: it cannot fail
	}
	return c
}

// publisher is the package's event sink, and reconciler its reconciler.
// slowNamespaces holds, by namespace, how long each reconcile of its actions takes at
// least: a worker busy that long, as on a loaded cluster.
var slowNamespaces sync.Map

var (
	publisher  *eventsink.Publisher
	reconciler *controller.TaskActionReconciler
	// outputs is the reconciler's cache, for the tests to ask what it holds.
	outputs *cacheclient.Cache
)

// startManager runs the executor's controller against the test API server for the whole
// package, with the core plugins and the test plugins below.
func startManager(env *kubetest.Env) (stop func(), err error) {
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: server.Options{BindAddress: "0"}})
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
	reg := core.NewRegistry(log)
	for _, e := range []core.Entry{sleep.Entry(), echo.Entry(), testPlugin("test-flaky", false), testPlugin("test-system", false),
		testPlugin("test-error", false), testPlugin("test-finalizer", true), testPlugin("test-echo", false), testPlugin("test-links", false),
		testPlugin("test-finalize-fails", false), testPlugin("test-waits", false)} {
		if err := reg.Register(e); err != nil {
			return nil, err
		}
	}
	if err := reg.Initialize(context.Background(), nil, nil); err != nil {
		return nil, err
	}
	publisher = eventsink.New(eventsSvc.client(), "test-cluster", clock.RealClock{}, log)
	if err := mgr.Add(publisher); err != nil {
		return nil, err
	}
	// As the executor's: actions' data only under dataDir (each project and domain with
	// its own part under projects/) and the mem:// outputs of newAction.
	store, err := datastore.Confine(datastore.New(), storagePrefixes())
	if err != nil {
		return nil, err
	}
	cacheClient, err := cacheclient.NewClient(cacheURL, rpcclient.Options{})
	if err != nil {
		return nil, err
	}
	// The metrics go where the executor's go, so that tests read them as a scrape would.
	instruments, err := metrics.New(ctrlmetrics.Registry, mgr.GetCache())
	if err != nil {
		return nil, err
	}
	// A heartbeat of 1 s (a reservation lapses after 3 missed): short for tests, and
	// not lost to a loaded machine's stalls, which let an identical action run too. As
	// the executor's, it heartbeats only while the action is in the informer cache, and
	// its background work runs under the manager.
	outputs = cacheclient.New(cacheClient, store, cacheclient.Options{Heartbeat: time.Second, Log: log,
		Metrics: instruments, Exists: cacheclient.ExistsIn(mgr.GetCache())})
	if err := mgr.Add(outputs); err != nil {
		return nil, err
	}
	r := &controller.TaskActionReconciler{
		Events: publisher, Metrics: instruments,
		Cache:  outputs,
		Client: mgr.GetClient(), Registry: reg, DataStore: store,
		Recorder: mgr.GetEventRecorderFor("flyte-executor"), Clock: clock.RealClock{}, Log: log,
		Options: controller.Options{
			MaxSystemFailures: maxSystemFailures, MaxConcurrentReconciles: 4,
			Backoff: backoff.Backoff{Base: 50 * time.Millisecond, Cap: 400 * time.Millisecond, Rand: func() float64 { return 0.5 }},
			// Each pass is counted, and slowed in the namespaces that ask for it.
			WrapReconciler: func(r reconcile.Reconciler) reconcile.Reconciler {
				return reconcile.Func(func(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
					observeReconcile(req)
					return r.Reconcile(ctx, req)
				})
			},
		},
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	reconciler = r
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() { cancel(); <-done }, nil
}

// observeReconcile is told of each reconcile as it starts: it sleeps as long as
// slowNamespaces says for the request's namespace, and counts it.
func observeReconcile(req ctrl.Request) {
	if d, ok := slowNamespaces.Load(req.Namespace); ok {
		time.Sleep(d.(time.Duration))
	}
	countMu.Lock()
	defer countMu.Unlock()
	v, _ := reconciles.LoadOrStore(req.String(), new(int64))
	*v.(*int64)++
}

func reconcileCount(namespace, name string) int64 {
	countMu.Lock()
	defer countMu.Unlock()
	v, ok := reconciles.Load(namespace + "/" + name)
	if !ok {
		return 0
	}
	return *v.(*int64)
}

// callLog records which plugin methods ran for which action.
type callLog struct {
	mu   sync.Mutex
	seen map[string][]string
}

func (c *callLog) add(action, call string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[action] = append(c.seen[action], call)
}

func (c *callLog) get(action string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen[action]...)
}

// testPluginImpl behaves by its ID:
//   - test-flaky fails (user error) attempts up to config.failAttempts, then succeeds;
//     with config.errorsFirst, its first calls return errors;
//   - test-links succeeds with log links, some of which the events service would refuse;
//   - test-system fails every attempt with a system error;
//   - test-error returns an error from every Handle;
//   - test-finalizer runs until aborted, and needs a finalizer;
//   - test-echo runs for config.runFor (default: no time), then copies its inputs to its
//     outputs, like core-echo;
//   - test-waits waits for resources config.waits times in a row, each a refusal with a
//     new version (as quota refusals are), then succeeds;
//   - test-finalize-fails runs while config.running is set, else fails and succeeds like
//     test-flaky; its Finalize fails the first config.finalizeFailures times it is called
//     for an action.
type testPluginImpl struct {
	id        string
	finalizer bool
}

func testPlugin(id string, finalizer bool) core.Entry {
	return core.Entry{ID: id, RegisteredTaskTypes: []string{id},
		LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) {
			return testPluginImpl{id: id, finalizer: finalizer}, nil
		}}
}

func (p testPluginImpl) GetID() string { return p.id }
func (p testPluginImpl) GetProperties() core.Properties {
	return core.Properties{NeedsFinalizer: p.finalizer}
}

func (p testPluginImpl) Handle(_ context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	md := tCtx.Metadata()
	calls.add(md.Action().Name, fmt.Sprintf("handle:%d", md.Attempt()))
	switch p.id {
	case "test-finalize-fails":
		if md.Action().Spec.Config["running"] != "" {
			return core.DoTransition(core.PhaseInfoRunning(0, "")), nil
		}
		fallthrough
	case "test-flaky":
		// config.errorsFirst: the first calls return an error (a failed call into a live
		// attempt, retried in place) before the attempt goes on.
		errorsFirst, _ := strconv.Atoi(md.Action().Spec.Config["errorsFirst"])
		var errored int
		if _, err := tCtx.PluginStateReader().Get(&errored); err != nil {
			return core.Transition{}, err
		}
		if errored < errorsFirst {
			if err := tCtx.PluginStateWriter().Put(1, errored+1); err != nil {
				return core.Transition{}, err
			}
			return core.Transition{}, errors.New("the plugin's API call failed")
		}
		failAttempts, _ := strconv.Atoi(md.Action().Spec.Config["failAttempts"])
		if int(md.Attempt()) <= failAttempts {
			return core.DoTransition(core.PhaseInfoUserFailure("ExitCode1", fmt.Sprintf("attempt %d failed", md.Attempt()))), nil
		}
		return core.DoTransition(core.PhaseInfoSuccess("")), nil
	case "test-links":
		info := core.PhaseInfoSuccess("")
		info.LogLinks = []core.LogLink{{Name: "good", URI: "https://logs.example.com/a0"}, {Name: "relative", URI: "a0/logs"},
			{Name: "spaces", URI: "https://logs.example.com/a 0"}, {Name: "", URI: "https://logs.example.com/unnamed"}}
		return core.DoTransition(info), nil
	case "test-waits":
		waits, _ := strconv.Atoi(md.Action().Spec.Config["waits"])
		var waited int
		if _, err := tCtx.PluginStateReader().Get(&waited); err != nil {
			return core.Transition{}, err
		}
		if waited == waits {
			return core.DoTransition(core.PhaseInfoSuccess("")), nil
		}
		if err := tCtx.PluginStateWriter().Put(1, waited+1); err != nil {
			return core.Transition{}, err
		}
		info := core.PhaseInfoWaitingForResources(uint32(waited+1), "ExceededQuota", fmt.Sprintf("refused %d times", waited+1))
		info.RequeueAfter = time.Millisecond
		return core.DoTransition(info), nil
	case "test-system":
		return core.DoTransition(core.PhaseInfoSystemFailure("NodeLost", "the node went away")), nil
	case "test-error":
		return core.Transition{}, errors.New("the plugin's API call failed")
	case "test-echo":
		runFor, _ := time.ParseDuration(md.Action().Spec.Config["runFor"])
		var started time.Time
		if _, err := tCtx.PluginStateReader().Get(&started); err != nil {
			return core.Transition{}, err
		}
		if started.IsZero() {
			started = md.Now()
			if err := tCtx.PluginStateWriter().Put(1, started); err != nil {
				return core.Transition{}, err
			}
		}
		if left := started.Add(runFor).Sub(md.Now()); left > 0 {
			info := core.PhaseInfoRunning(0, "")
			info.RequeueAfter = left
			return core.DoTransition(info), nil
		}
		return echo.Plugin{}.Handle(context.Background(), tCtx)
	default:
		return core.DoTransition(core.PhaseInfoRunning(0, "")), nil
	}
}

func (p testPluginImpl) Abort(_ context.Context, tCtx core.TaskExecutionContext) error {
	calls.add(tCtx.Metadata().Action().Name, "abort")
	return nil
}

// finalizeCalls counts test-finalize-fails' Finalize calls: "namespace/name" -> *atomic.Int32.
var finalizeCalls sync.Map

func (p testPluginImpl) Finalize(_ context.Context, tCtx core.TaskExecutionContext) error {
	ta := tCtx.Metadata().Action()
	if p.id == "test-finalize-fails" {
		n, _ := finalizeCalls.LoadOrStore(ta.Namespace+"/"+ta.Name, new(atomic.Int32))
		failures, _ := strconv.Atoi(ta.Spec.Config["finalizeFailures"])
		if int(n.(*atomic.Int32).Add(1)) <= failures {
			calls.add(ta.Name, "finalize:error")
			return errors.New("the plugin could not delete what it created")
		}
	}
	calls.add(ta.Name, "finalize")
	return nil
}
