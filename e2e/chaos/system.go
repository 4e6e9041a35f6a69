package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/process"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/systemtest"
)

// Namespaces of the soak: its actions, and the executors' leader-election lock.
const (
	taskNamespace  = "chaos"
	leaderNS       = "chaos-system"
	leaderLockName = "chaos.flyte.org"
)

// proc is one program of the soak, a process of its own.
type proc = process.Process

// system is everything the soak runs, each program a process of its own.
type system struct {
	dir, logs  string
	cp         *systemtest.ControlPlane
	pg         *postgres
	executors  []*proc
	execHealth []string // /readyz URLs
	execMetric []string // /metrics URLs
	// events are the events service's replicas, on one database: each executor
	// replica records through its own (executor-i to events-i), and the soak watches
	// each (watchers.go).
	events     []*proc
	cache      *proc
	eventsURLs []string
	eventsURL  string // the first replica's, which the checks read
	cacheURL   string
	health     map[*proc]string // each service's health check
	// proxy stands between the programs and what they reach (proxy.go).
	proxy     *faultProxy
	svcClient *http.Client // trusts the soak's CA
	client    client.WithWatch
	viewer    eventsv1connect.EventsServiceClient
	// watchClient is the viewer's, without a deadline, for WatchActions streams.
	watchClient *http.Client
	// cacheReader reads cache entries with the executor's token, the only one the cache
	// service serves them to; the soak only reads.
	cacheReader cachev1connect.CacheServiceClient
	dataDir     string // file:// inputs and outputs of the actions
	// node is the real node the pods run on; nil with the stand-in kubelet.
	node *systemtest.Node
	// store is the file system under dataDir, which the soak can stall; nil without
	// root, when dataDir is a plain directory.
	store *store
}

// image is the image of the soak's container actions: one the real node holds, or any
// name for the stand-in kubelet, which runs nothing.
func (s *system) image() string {
	if s.node != nil {
		return s.node.Image
	}
	return "busybox:1.36"
}

// startSystem brings everything up in dir; stop takes it all down.
func startSystem(ctx context.Context, dir, assets, node string, log func(string, ...any)) (s *system, err error) {
	s = &system{dir: dir, logs: filepath.Join(dir, "logs"), dataDir: filepath.Join(dir, "data")}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	if os.Geteuid() == 0 {
		if s.store, err = mountStore(ctx, dir, s.dataDir); err != nil {
			return s, err
		}
	} else {
		log("not root: the data store is a plain directory, and the soak cannot stall it (no %s)", faultStallStore)
	}
	for _, d := range []string{s.logs, filepath.Join(s.dataDir, "inputs"), filepath.Join(s.dataDir, "outputs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return s, fmt.Errorf("system: %w", err)
		}
	}
	root, err := repo.Root()
	if err != nil {
		return s, err
	}
	bins, err := systemtest.Build(ctx, root, systemtest.BinDir("chaos"))
	if err != nil {
		return s, err
	}
	log("built the programs in %s", systemtest.BinDir("chaos"))
	creds, err := devcreds.Ensure(filepath.Join(dir, "creds"))
	if err != nil {
		return s, err
	}
	if s.cp, err = systemtest.StartControlPlane(ctx, assets, dir, s.logs, creds); err != nil {
		return s, err
	}
	if s.client, err = newClient(s.cp); err != nil {
		return s, err
	}
	// The CRD alone: not the admission policy of deploy/kustomize/base/admission, which
	// would refuse the hostile tenant's forged actions before the executor saw them. The
	// soak tests the executor's own check (executor/tenancy), which holds where a cluster
	// lacks the policy.
	if err := kubetest.ApplyCRD(ctx, s.client, filepath.Join(root, "deploy", "crd", "flyte.org_taskactions.yaml"), "chaos"); err != nil {
		return s, err
	}
	// hostile has no project label: its name is its project (hostile.go).
	for _, ns := range []string{taskNamespace, hostileNamespace, leaderNS} {
		if err := s.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return s, fmt.Errorf("system: creating namespace %s: %w", ns, err)
		}
	}

	// An object the API server refuses to delete, for the undeletable fault.
	if err := refuseDeletes(ctx, s.client); err != nil {
		return s, err
	}

	log("control plane up at %s", s.cp.URL)
	if s.node, err = systemtest.StartNode(ctx, node, s.client, dir, s.cp.Kubeconfig, log); err != nil {
		return s, err
	}
	if s.pg, err = startPostgres(ctx, root); err != nil {
		return s, err
	}
	dbURL, err := systemtest.CreateDatabase(ctx, s.pg.url, "flyte")
	if err != nil {
		return s, err
	}

	// The fault proxy: the services reach Postgres through it, the executors the API
	// server, the events and the cache service.
	s.proxy = newFaultProxy()
	pgVia, err := s.proxy.add(linkPostgres, s.pg.addr)
	if err != nil {
		return s, err
	}
	svcDBURL := strings.Replace(dbURL, s.pg.addr, pgVia, 1)
	if svcDBURL == dbURL {
		return s, fmt.Errorf("system: the database URL %q does not name %s", dbURL, s.pg.addr)
	}

	p, err := ports.Free(12)
	if err != nil {
		return s, err
	}
	if s.svcClient, err = rpcclient.New(rpcclient.Options{CAFile: creds.CAFile, Timeout: 5 * time.Second}); err != nil {
		return s, err
	}
	svcArgs := func(listen, metrics int) []string {
		return []string{"--listen", "127.0.0.1:" + strconv.Itoa(listen), "--metrics-listen", "127.0.0.1:" + strconv.Itoa(metrics),
			"--tls-cert-file", creds.CertFile, "--tls-key-file", creds.KeyFile, "--auth-mode", "token-file", "--auth-token-file", creds.TokensFile}
	}
	env := []string{"DATABASE_URL=" + svcDBURL, "OTEL_SDK_DISABLED=true"}
	s.health = map[*proc]string{}
	for i := range eventsReplicas {
		e := process.New(fmt.Sprintf("events-%d", i), bins["events"], s.logs, env, svcArgs(p[8+2*i], p[9+2*i])...)
		s.events = append(s.events, e)
		s.eventsURLs = append(s.eventsURLs, "https://127.0.0.1:"+strconv.Itoa(p[8+2*i]))
		s.health[e] = s.eventsURLs[i] + "/healthz"
	}
	s.eventsURL, s.cacheURL = s.eventsURLs[0], "https://127.0.0.1:"+strconv.Itoa(p[1])
	s.cache = process.New("cacheservice", bins["cacheservice"], s.logs, env, svcArgs(p[1], p[3])...)
	s.health[s.cache] = s.cacheURL + "/healthz"
	for _, svc := range s.services() {
		if err := s.startService(ctx, svc); err != nil {
			return s, err
		}
	}
	// What the executors reach, through the proxy: the API server (a kubeconfig of its
	// own), each events replica and the cache service.
	apiVia, err := s.proxy.add(linkAPIServer, strings.TrimPrefix(s.cp.URL, "https://"))
	if err != nil {
		return s, err
	}
	execKubeconfig, err := s.cp.KubeconfigVia(apiVia)
	if err != nil {
		return s, err
	}
	var execEvents []string
	for _, u := range s.eventsURLs {
		via, err := s.proxy.add(linkEvents, strings.TrimPrefix(u, "https://"))
		if err != nil {
			return s, err
		}
		execEvents = append(execEvents, "https://"+via)
	}
	cacheVia, err := s.proxy.add(linkCache, strings.TrimPrefix(s.cacheURL, "https://"))
	if err != nil {
		return s, err
	}
	viewer, err := rpcclient.New(rpcclient.Options{CAFile: creds.CAFile, TokenFile: creds.ViewerTokenFile, Timeout: 10 * time.Second})
	if err != nil {
		return s, err
	}
	s.viewer = eventsv1connect.NewEventsServiceClient(viewer, s.eventsURL)
	// Streams last as long as the run: no deadline on the request.
	if s.watchClient, err = rpcclient.New(rpcclient.Options{CAFile: creds.CAFile, TokenFile: creds.ViewerTokenFile}); err != nil {
		return s, err
	}
	reader, err := rpcclient.New(rpcclient.Options{CAFile: creds.CAFile, TokenFile: creds.ExecutorTokenFile, Timeout: 10 * time.Second})
	if err != nil {
		return s, err
	}
	s.cacheReader = cachev1connect.NewCacheServiceClient(reader, s.cacheURL)

	log("Postgres and the services up")
	for i := range 2 {
		cfg := executorConfig(s, creds, p[4+2*i], p[5+2*i])
		cfg.EventsServiceURL, cfg.CacheServiceURL = execEvents[i], "https://"+cacheVia
		e, err := systemtest.NewExecutor(systemtest.ExecutorOptions{Name: fmt.Sprintf("executor-%d", i), Binary: bins["executor"], LogDir: s.logs,
			ConfigFile: filepath.Join(dir, fmt.Sprintf("executor-%d.yaml", i)), Config: cfg,
			Kubeconfig: execKubeconfig, Env: []string{"OTEL_SDK_DISABLED=true"}})
		if err != nil {
			return s, fmt.Errorf("system: %w", err)
		}
		s.executors = append(s.executors, e.Process)
		s.execHealth = append(s.execHealth, e.Readyz)
		s.execMetric = append(s.execMetric, e.Metrics)
		if err := s.startExecutor(ctx, i); err != nil {
			return s, err
		}
	}
	return s, nil
}

// executorConfig is one replica's configuration: leader election on, the soak's
// namespaces only (the chaos tenant's and the hostile one's), retries quick enough to
// finish within a short run.
func executorConfig(s *system, creds *devcreds.Credentials, health, metrics int) config.Config {
	cfg := config.Default()
	cfg.LeaderElect = true
	cfg.LeaderElectionID, cfg.LeaderElectionNamespace = leaderLockName, leaderNS
	cfg.Namespaces = []string{taskNamespace, hostileNamespace}
	cfg.ServiceCAFile, cfg.ServiceTokenFile = creds.CAFile, creds.ExecutorTokenFile
	cfg.HealthProbeBindAddress = "127.0.0.1:" + strconv.Itoa(health)
	cfg.MetricsBindAddress = "127.0.0.1:" + strconv.Itoa(metrics)
	cfg.MetricsSecure = false
	cfg.RetryBackoff.Base = metav1.Duration{Duration: 200 * time.Millisecond}
	cfg.RetryBackoff.Cap = metav1.Duration{Duration: 2 * time.Second}
	cfg.Cluster = "chaos"
	// One prefix for both tenants, without {project}: the store does not keep them
	// apart, so that only the executor's tenancy check stands between a forged project
	// and the chaos tenant's data, and the soak tests it.
	cfg.Storage.AllowedPrefixes = []string{"file://" + filepath.ToSlash(s.dataDir)}
	// Pods' outputs are staged and collected, as on a single node (make run): the hostile
	// tenant's error documents and output trees are read where the executor reads them.
	cfg.K8s.MountFileStorage = true
	// Small, so that the hostile tenant's tree over it is a thousand empty files, cheap
	// on a shared machine; the bound's code is the same at any size.
	cfg.Storage.MaxOutputEntries = soakMaxOutputEntries
	// Short and small, so that an outage of the events service outlasts the TTL within
	// a run and the bound on stored actions is reached (bound.go).
	cfg.GC.Interval = metav1.Duration{Duration: soakGCInterval}
	cfg.GC.MaxTTL = metav1.Duration{Duration: soakGCTTL}
	cfg.GC.MaxFinished, cfg.GC.MaxFinishedPerNamespace = soakMaxFinished, soakMaxFinished
	cfg.EventsBacklog.MaxUndeliveredFinished = soakMaxUndeliveredFinished
	// A stalled store fails a call soon (faults.go, stall-store): shorter than a stall.
	cfg.Storage.CallTimeout = metav1.Duration{Duration: soakStoreCallTimeout}
	return cfg
}

// startService starts (or restarts) a service and waits for its health check.
func (s *system) startService(ctx context.Context, p *proc) error {
	if err := p.Start(); err != nil {
		return err
	}
	return p.WaitHTTP(ctx, s.svcClient, s.health[p], 2*time.Minute)
}

// startExecutor starts (or restarts) replica i and waits until it is ready: a standby
// answers too, since readiness does not wait for the lease.
func (s *system) startExecutor(ctx context.Context, i int) error {
	if err := s.executors[i].Start(); err != nil {
		return err
	}
	return s.executors[i].WaitHTTP(ctx, http.DefaultClient, s.execHealth[i], 2*time.Minute)
}

// stop takes down everything that was started, programs first.
func (s *system) stop() {
	for _, e := range s.executors {
		e.Stop(15 * time.Second)
	}
	for _, p := range s.services() {
		if p != nil {
			p.Stop(15 * time.Second)
		}
	}
	if s.proxy != nil {
		s.proxy.stop()
	}
	if s.pg != nil {
		s.pg.stop()
	}
	if s.node != nil {
		s.node.Stop()
	}
	if s.cp != nil {
		s.cp.Stop()
	}
	if s.store != nil {
		s.store.unmount()
	}
}

// newClient is the soak's own client of the API server, which plays the user and the
// kubelet.
func newClient(cp *systemtest.ControlPlane) (client.WithWatch, error) {
	scheme, err := executor.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return c, nil
}

// allProcs is every process of the system, the control plane's included.
func (s *system) allProcs() []*proc {
	out := append(s.services(), s.executors...)
	if s.cp != nil {
		out = append(out, s.cp.Etcd, s.cp.APIServer)
	}
	return out
}

// eventsReplicas is how many replicas of the events service run.
const eventsReplicas = 2

// services are the events replicas and the cache service.
func (s *system) services() []*proc {
	out := append([]*proc(nil), s.events...)
	if s.cache != nil {
		out = append(out, s.cache)
	}
	return out
}
