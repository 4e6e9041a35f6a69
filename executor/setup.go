package executor

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/backlog"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/datastore/prefix"
	"github.com/flytekube/backend/executor/eventsink"
	"github.com/flytekube/backend/executor/fairqueue"
	executormetrics "github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
	"github.com/flytekube/backend/executor/plugins/core/echo"
	"github.com/flytekube/backend/executor/plugins/core/sleep"
	"github.com/flytekube/backend/executor/plugins/k8s/container"
	"github.com/flytekube/backend/executor/plugins/k8s/job"
	"github.com/flytekube/backend/executor/tracing"
	"github.com/flytekube/backend/internal/backoff"
	"github.com/flytekube/backend/internal/rpcclient"
)

// reservationHeartbeat is how often a running serializable action extends its cache
// reservation; the cache service caps it (10s by default) and expires a reservation
// after a few missed beats.
const reservationHeartbeat = 5 * time.Second

// Options are what an embedder of the executor may change of what Setup builds, as
// controller-runtime's options are; the zero value is the executor's binary.
type Options struct {
	// Clock replaces the real clock of the reconciler, the events publisher and the
	// garbage collector.
	Clock clock.PassiveClock
	// Plugins are registered beside the built-in ones.
	Plugins []core.Entry
	// MetricsRegistry receives the executor's metrics instead of controller-runtime's
	// registry, which its metrics endpoint serves. Each executor in a process needs one
	// of its own.
	MetricsRegistry prometheus.Registerer
	// TracerProvider receives the executor's spans instead of the global provider (which
	// a binary sets up with services/telemetry), for an executor run beside other traced
	// services in one process.
	TracerProvider trace.TracerProvider
	// OnDelivered is called (from the publisher's goroutine) with each finished action
	// whose whole history the events service acknowledged (eventsink.OnDelivered).
	OnDelivered func(*flytev1.TaskAction)
	// SkipNameValidation lets the controller share its name with another one in the
	// process (controller-runtime's controller.Options.SkipNameValidation), for more
	// than one executor in a process, each with its own MetricsRegistry.
	SkipNameValidation bool
	// NewQueue makes the controller's work queue (controller-runtime's
	// controller.Options.NewQueue); nil makes it fair across namespaces, weighted by the
	// configuration's queueWeights (controller.NamespaceFairQueue).
	NewQueue func(controllerName string, rateLimiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request]
	// NewCache makes the manager's informer cache from the options Setup chose (what it
	// watches, in which namespaces, what it keeps of each object); nil is
	// controller-runtime's cache.New (manager.Options.NewCache).
	NewCache cache.NewCacheFunc
	// WrapReconciler, when set, wraps the reconciler the controller calls
	// (controller.Options.WrapReconciler): a middleware that observes, times or delays
	// each pass.
	WrapReconciler func(reconcile.Reconciler) reconcile.Reconciler
}

// Scheme knows the Kubernetes built-in types and TaskAction.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, flytev1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Setup builds the executor's manager from its configuration: the TaskAction controller
// with the built-in plugins, the garbage collector when enabled, metrics, health probes
// and leader election. Every background loop (the events publisher, the garbage
// collector, the cache's heartbeats and releases) is a Runnable of the manager, built
// here with what it needs, and stops with it. It first waits for the API server to answer, for as long as ctx
// lasts: ctx bounds Setup (that wait, loading the plugins), not the manager, which runs
// under the context given to its Start.
func Setup(ctx context.Context, cfg config.Config, restConfig *rest.Config, log *slog.Logger, opts Options) (manager.Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("executor: config: %w", err)
	}
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
	// Building the manager needs the API server's discovery: an executor started during
	// an outage waits for it, where exiting would leave its return after the outage to
	// the kubelet's crash-loop back-off.
	if err := waitForAPIServer(ctx, restConfig, cfg.HealthProbeBindAddress, log); err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}

	// HTTP/2 stays off unless asked for: it exposes the metrics server to the HTTP/2
	// stream-cancellation and rapid-reset attacks.
	var tlsOpts []func(*tls.Config)
	if !cfg.EnableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	// Kubernetes API calls made within a reconcile are spans of it; the interceptors
	// carry the action's trace on to the cache and events services.
	restConfig = tracing.WrapKubernetes(restConfig, opts.TracerProvider)
	traced, err := tracing.ConnectOption(opts.TracerProvider)
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	metrics := metricsserver.Options{BindAddress: cfg.MetricsBindAddress, SecureServing: cfg.MetricsSecure, TLSOpts: tlsOpts}
	if cfg.MetricsSecure {
		// Only authenticated callers allowed to GET /metrics (by RBAC) may scrape.
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
		if cfg.MetricsCertPath != "" {
			metrics.CertDir, metrics.CertName, metrics.KeyName = cfg.MetricsCertPath, cfg.MetricsCertName, cfg.MetricsCertKey
		}
	}
	// The plugins take the k8s section as is, with what it does not hold filled in.
	k8sCfg := cfg.K8s
	k8sCfg.ExecutorNamespace = executorNamespace(cfg.ExecutorNamespace)
	k8sCfg.LogLinks = nil // from logLinks alone, below
	for _, l := range cfg.LogLinks {
		t, err := template.New(l.Name).Option("missingkey=error").Parse(l.URITemplate)
		if err != nil {
			return nil, fmt.Errorf("executor: config: logLinks %s: %w", l.Name, err)
		}
		k8sCfg.LogLinks = append(k8sCfg.LogLinks, k8s.LogLinkTemplate{Name: l.Name, Template: t})
	}
	if k8sCfg.DeviceFaultRules, err = k8s.CompileDeviceFaults(cfg.K8s.DeviceFaults); err != nil {
		return nil, fmt.Errorf("executor: config: %w", err)
	}
	reg := core.NewRegistry(log)
	for _, e := range append([]core.Entry{sleep.Entry(), echo.Entry(), container.Entry(k8sCfg), job.Entry(k8sCfg)}, opts.Plugins...) {
		if err := reg.Register(e); err != nil {
			return nil, err
		}
	}

	// The informers of the kinds plugins create (pods, jobs) hold only the objects the
	// executor manages, so their memory does not grow with the cluster. The controller
	// watches the same reg.Watches(), so no kind is watched without this restriction.
	managed := labels.SelectorFromSet(labels.Set{core.LabelManagedBy: core.ManagedByValue})
	// Managed fields are nearly half of a finished TaskAction's bytes, and the executor
	// never reads them (it writes with merge patches and updates, which keep them on the
	// API server): the cache holds none, of any kind. Of pods and Jobs it holds what the
	// executor reads, not their copy of the action's spec (cachedObjects). Actions are
	// held whole: their spec is what the executor runs, bounded by the CRD's limits.
	cacheOpts := cache.Options{ByObject: map[client.Object]cache.ByObject{}, DefaultTransform: cachedObjects()}
	for _, obj := range reg.Watches() {
		cacheOpts.ByObject[obj] = cache.ByObject{Label: managed}
	}
	// Every namespaced informer (actions, pods, jobs, events) watches the managed
	// namespaces only, so RoleBindings there are all the executor needs.
	namespaces := cfg.Namespaces
	if len(namespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	// PodTemplates: only those labelled for tasks, in the managed namespaces and the
	// executor's own, where a platform team keeps the templates every tenant may name.
	templates := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{podtemplate.Label: "true"})}
	if ns := k8sCfg.ExecutorNamespace; len(namespaces) > 0 && ns != "" {
		templates.Namespaces = maps.Clone(cacheOpts.DefaultNamespaces)
		templates.Namespaces[ns] = cache.Config{}
	}
	cacheOpts.ByObject[&corev1.PodTemplate{}] = templates
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metrics,
		HealthProbeBindAddress:        cfg.HealthProbeBindAddress,
		LeaderElection:                cfg.LeaderElect,
		LeaderElectionID:              cfg.LeaderElectionID,
		LeaderElectionNamespace:       cfg.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true, // a clean stop hands over at once
		Cache:                         cacheOpts,
		NewCache:                      opts.NewCache,
		// Secrets are read one at a time, in the executor's own namespace: caching them
		// would watch (and hold) Secrets and need list and watch on them.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("executor: creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}

	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	// The PodTemplates' informer starts with the manager, which waits for it before any
	// reconcile: a template is then read from memory, and missing RBAC for them shows at
	// start rather than as a stuck reconcile.
	if _, err := mgr.GetCache().GetInformer(ctx, &corev1.PodTemplate{}); err != nil {
		return nil, fmt.Errorf("executor: PodTemplates' informer: %w", err)
	}
	recorder := mgr.GetEventRecorderFor("flyte-executor")
	if err := reg.Initialize(ctx, setupContext{mgr, recorder}, cfg.DefaultForTaskTypes); err != nil {
		return nil, err
	}
	// Actions read and write their data only where the configuration allows: a cache
	// entry names where a hit's outputs are copied from, and anyone who reaches the cache
	// service may have written it.
	st := cfg.Storage
	store, err := datastore.Confine(datastore.NewLimited(datastore.Limits{
		MaxDocumentBytes: st.MaxDocumentBytes.Value(), MaxCopyBytes: st.MaxCopyBytes.Value(),
		CallTimeout: st.CallTimeout.Duration, CopyTimeout: st.CopyTimeout.Duration,
		MaxOutputEntries: st.MaxOutputEntries, MaxOutputDepth: st.MaxOutputDepth,
	}), cfg.Storage.AllowedPrefixes)
	if err != nil {
		return nil, fmt.Errorf("executor: config: storage.allowedPrefixes: %w", err)
	}
	if len(cfg.Storage.AllowedPrefixes) == 0 {
		log.Info("storage.allowedPrefixes is empty: each action reads only its inputUri and writes only under its runOutputBase, cached outputs are reused only within a run, and file:// is refused")
	}
	if !slices.ContainsFunc(cfg.Storage.AllowedPrefixes, func(p string) bool { return strings.Contains(p, prefix.Project) }) {
		// The tenancy check keeps each action to its namespace's project; only a prefix
		// with the project in it keeps each project's data to that project's actions.
		log.Warn("no storage.allowedPrefixes entry holds " + prefix.Project + ": an action may name another project's data as its inputs or outputs; on a shared cluster give each project its part, such as s3://bucket/{project}/{domain}/")
	}
	conn := rpcclient.Options{CAFile: cfg.ServiceCAFile, TokenFile: cfg.ServiceTokenFile}
	for _, u := range []struct{ name, url string }{{"eventsServiceURL", cfg.EventsServiceURL}, {"cacheServiceURL", cfg.CacheServiceURL}} {
		if cfg.ServiceTokenFile != "" && strings.HasPrefix(u.url, "http://") {
			log.Warn("the service token is sent without TLS; use an https URL unless the network encrypts it", "field", u.name, "url", u.url)
		}
	}
	registry := opts.MetricsRegistry
	if registry == nil {
		registry = ctrlmetrics.Registry
	}
	instruments, err := executormetrics.New(registry, mgr.GetCache())
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	queueMetrics, err := fairqueue.NewMetrics(registry)
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	r := &controller.TaskActionReconciler{
		Client: mgr.GetClient(), Registry: reg, Metrics: instruments, DataStore: store,
		Recorder: recorder, Clock: clk, Log: log, TracerProvider: opts.TracerProvider,
		Options: controller.Options{
			DefaultServiceAccount:   cfg.DefaultServiceAccount,
			ExecutorNamespace:       executorNamespace(cfg.ExecutorNamespace),
			MaxSystemFailures:       int32(cfg.MaxSystemFailures),
			MaxConcurrentReconciles: cfg.MaxConcurrentReconciles,
			SkipNameValidation:      opts.SkipNameValidation,
			QueueWeights:            cfg.QueueWeights,
			QueueMetrics:            queueMetrics,
			NewQueue:                opts.NewQueue,
			WrapReconciler:          opts.WrapReconciler,
			Backoff:                 backoff.Backoff{Base: cfg.RetryBackoff.Base.Duration, Cap: cfg.RetryBackoff.Cap.Duration},
			Tenancy:                 cfg.Tenancy.Rule(),

			// The controller places interruptible actions' attempts, from their system failures.
			InterruptibleFailureThreshold: int32(cfg.K8s.InterruptibleFailureThreshold),
		},
	}
	if cfg.CacheServiceURL != "" {
		client, err := cacheclient.NewClient(cfg.CacheServiceURL, conn, traced)
		if err != nil {
			return nil, fmt.Errorf("executor: %w", err)
		}
		// A reservation is heartbeated only while its action exists (in the informer
		// cache); the heartbeats and the releases of gone actions' reservations run under
		// the manager, never the informer's delete handler, and stop with it.
		cc := cacheclient.New(client, store, cacheclient.Options{Heartbeat: reservationHeartbeat,
			Log: log.With("component", "cache"), Metrics: instruments, Exists: cacheclient.ExistsIn(mgr.GetCache()),
			KeyScope: cacheKeyScope(cfg)})
		if err := mgr.Add(cc); err != nil {
			return nil, fmt.Errorf("executor: adding the cache's heartbeats and releases: %w", err)
		}
		r.Cache = cc
	}
	if cfg.EventsServiceURL != "" {
		// Events the service refuses are held and recorded on their action for kubectl
		// describe, beside the counters and the log; given up only past an operator's limit.
		pubOpts := []eventsink.Option{eventsink.WithMetrics(instruments), eventsink.WithRecorder(recorder),
			eventsink.WithMaxRefusals(cfg.EventsDelivery.MaxRefusals)}
		if opts.TracerProvider != nil {
			pubOpts = append(pubOpts, eventsink.WithTracerProvider(opts.TracerProvider))
		}
		client, err := eventsink.NewClient(cfg.EventsServiceURL, conn, traced)
		if err != nil {
			return nil, fmt.Errorf("executor: %w", err)
		}
		if opts.OnDelivered != nil {
			pubOpts = append(pubOpts, eventsink.OnDelivered(opts.OnDelivered))
		}
		pub := eventsink.New(client, cfg.Cluster, clk, log.With("component", "events"), pubOpts...)
		if err := mgr.Add(pub); err != nil {
			return nil, err
		}
		r.Events = pub
		// While the events service is away, finished actions stay until their history is
		// delivered: past a bound, new actions wait rather than fill etcd. The gate asks
		// the publisher what is delivered and hears of each delivery from it; the
		// publisher knows nothing of the gate.
		r.Backlog = backlog.New(pub, backlog.Options{Max: cfg.EventsBacklog.MaxUndeliveredFinished, Cache: mgr.GetCache(),
			Metrics: instruments, Log: log.With("component", "events-backlog")})
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("executor: setting up the controller: %w", err)
	}
	if cfg.GC.Interval.Duration > 0 {
		var delivered func(*flytev1.TaskAction) bool
		if r.Events != nil {
			delivered = r.Events.Delivered
		}
		gc := controller.NewGarbageCollector(mgr.GetCache(), mgr.GetClient(), controller.GarbageCollectorOptions{
			Delivered: delivered, Interval: cfg.GC.Interval.Duration, MaxTTL: cfg.GC.MaxTTL.Duration,
			MaxFinished: cfg.GC.MaxFinished, MaxFinishedPerNamespace: cfg.GC.MaxFinishedPerNamespace,
			DeletesPerSecond: cfg.GC.DeletesPerSecond, Clock: clk, Log: log.With("component", "gc"), Metrics: instruments,
			Recorder: recorder})
		if err := mgr.Add(gc); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// apiServerRetry spaces the probes of an API server that does not answer: quickly at
// first, since a restarting one is back in seconds, and then at most every 10 s, so that
// the executor is back within seconds of the end of an outage.
var apiServerRetry = backoff.Backoff{Base: 250 * time.Millisecond, Cap: 10 * time.Second}

// apiServerProbeTimeout bounds one probe, so that a server that accepts connections but
// never answers is retried like one that refuses them.
const apiServerProbeTimeout = 10 * time.Second

// waitForAPIServer returns once the API server of restConfig serves flyte.org/v1 in its
// discovery (building the manager needs both), or with ctx's error and the last probe's.
// Each failed probe is logged at WARN with the server's URL and the error. While it
// waits, /healthz answers on healthAddr (the manager's health address, taken over by the
// manager once it is built), so that the liveness probe does not restart the executor
// for an outage it is riding out; /readyz says what it waits for.
func waitForAPIServer(ctx context.Context, restConfig *rest.Config, healthAddr string, log *slog.Logger) error {
	probeConfig := rest.CopyConfig(restConfig)
	probeConfig.Timeout = apiServerProbeTimeout
	dc, err := discovery.NewDiscoveryClientForConfig(probeConfig)
	if err != nil {
		return fmt.Errorf("reaching the API server at %s: %w", restConfig.Host, err)
	}
	path := "/apis/" + flytev1.GroupVersion.String()
	probe := func() error {
		err := dc.RESTClient().Get().AbsPath(path).Do(ctx).Error()
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("the API server does not serve %s: is the TaskAction CRD installed? %w", flytev1.GroupVersion, err)
		}
		return err
	}
	err = probe()
	if err == nil {
		return nil
	}
	began := time.Now()
	var waiting atomic.Pointer[string] // the last probe's error, for /readyz
	waiting.Store(new(err.Error()))
	stopServing, serveErr := serveHealthWhileWaiting(healthAddr, &waiting, log)
	if serveErr != nil {
		return serveErr
	}
	defer stopServing()
	for n := int32(1); ; n++ {
		delay := apiServerRetry.Delay(n)
		log.Warn("waiting for the Kubernetes API server", "url", restConfig.Host, "error", err.Error(),
			"retryIn", delay.Round(time.Millisecond).String(), "waited", time.Since(began).Round(time.Second).String())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gave up waiting for the API server at %s after %s: %w (last: %w)",
				restConfig.Host, time.Since(began).Round(time.Second), context.Cause(ctx), err)
		case <-t.C:
		}
		if err = probe(); err == nil {
			log.Info("the Kubernetes API server answers", "url", restConfig.Host, "waited", time.Since(began).Round(time.Millisecond).String())
			return nil
		}
		waiting.Store(new(err.Error()))
	}
}

// serveHealthWhileWaiting answers /healthz (alive) and /readyz (not ready, with why) on
// addr until stop is called; nothing when addr is "0" or empty, as the manager would.
func serveHealthWhileWaiting(addr string, waiting *atomic.Pointer[string], log *slog.Logger) (stop func(), err error) {
	if addr == "" || addr == "0" {
		return func() {}, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving health probes on %s while waiting for the API server: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "waiting for the Kubernetes API server: "+*waiting.Load(), http.StatusServiceUnavailable)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	return func() {
		// Closed, not shut down gracefully: the answers are instant, and the manager
		// binds the same address right after.
		_ = srv.Close()
		<-done
	}, nil
}

// serviceAccountNamespace is where a pod's service account names its namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// executorNamespace is the configured namespace, else the pod's, else none.
func executorNamespace(configured string) string {
	if configured != "" {
		return configured
	}
	b, err := os.ReadFile(serviceAccountNamespace)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// setupContext is what plugins get when they are loaded.
type setupContext struct {
	mgr      manager.Manager
	recorder record.EventRecorder
}

func (s setupContext) Client() client.Client               { return s.mgr.GetClient() }
func (s setupContext) APIReader() client.Reader            { return s.mgr.GetAPIReader() }
func (s setupContext) Cache() cache.Cache                  { return s.mgr.GetCache() }
func (s setupContext) EventRecorder() record.EventRecorder { return s.recorder }

// cacheKeyScope is the scope of the executor's cache keys: its cluster when its entries
// are its own (config.CachePerCluster), else none, which shares them.
func cacheKeyScope(cfg config.Config) string {
	if cfg.CacheSharing == config.CachePerCluster {
		return cfg.Cluster
	}
	return ""
}
