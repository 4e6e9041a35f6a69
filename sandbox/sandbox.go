// Package sandbox runs the whole system on one machine for a newcomer: an embedded
// control plane (or the cluster KUBECONFIG names), a throwaway Postgres, Jaeger, NATS
// with JetStream, the events and cache services and the executor, each as its own
// process; the events service publishes every event as a CloudEvent to NATS and to an
// HTTP receiver in the sandbox. It applies the TaskActions in examples/, shows their
// progress, and says where to look. Everything it starts stops with it.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/nodetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/systemtest"
)

// Options shape a sandbox. The zero value of a port means its default.
type Options struct {
	// Dir holds the sandbox's files: kubeconfig, configuration, logs, data. Default
	// /tmp/flyte-sandbox, the directory the examples' URIs name.
	Dir string
	// Kubeconfig names a cluster to use instead of the embedded control plane.
	Kubeconfig string
	// NoNode uses the embedded control plane without a node even where a real node can
	// run (as root): faster to start, but container examples are left out.
	NoNode bool
	// SecondCluster starts a second cluster beside the first, an embedded control plane
	// named SecondClusterName with an executor of its own, reporting to the same events
	// and cache services; the examples marked for it run there.
	SecondCluster bool
	// SecondExecutorHealthPort and SecondExecutorMetricsPort are the second executor's.
	SecondExecutorHealthPort, SecondExecutorMetricsPort int
	// Ports of the events service, the cache service, the executor's health probes and
	// metrics, and Jaeger's query API and OTLP/HTTP receiver.
	EventsPort, CachePort, ExecutorHealthPort, ExecutorMetricsPort, JaegerQueryPort, JaegerOTLPPort int
	// EventsMetricsPort and CacheMetricsPort serve the services' /metrics.
	EventsMetricsPort, CacheMetricsPort int
	// ConsolePort serves the events service's web console.
	ConsolePort int
	// PrometheusPort serves Prometheus, which scrapes the three programs and evaluates
	// the alert rules of deploy/kustomize/components/monitoring.
	PrometheusPort int
	// NATSPort is NATS's client port (JetStream on), one of the events service's
	// CloudEvents sinks; CloudEventsReceiverPort serves the other, an HTTP receiver.
	NATSPort, CloudEventsReceiverPort int
	// UntilSettled ends the sandbox once every example has ended, with an error if one
	// did not end as expected; otherwise it runs until ctx ends (Ctrl-C).
	UntilSettled bool
	// Timeout bounds UntilSettled.
	Timeout time.Duration
	// Terminal redraws the progress table in place.
	Terminal bool
	// Settled, with UntilSettled, runs once every example ended as expected, before
	// anything stops: tests look at the running system through it.
	Settled func(ctx context.Context, e Endpoints) error
	// CredentialsDir keeps the services' CA, certificate and tokens between runs
	// (services/auth/devcreds). Default: dev-credentials in the cache directory
	// ($FLYTE_CACHE_DIR, else ~/.cache/flyte-executor), outside the clone.
	CredentialsDir string
}

// Endpoints are where the running system answers.
type Endpoints struct {
	// EventsMetrics, CacheMetrics and ExecutorMetrics are /metrics URLs.
	EventsMetrics, CacheMetrics, ExecutorMetrics string
	// JaegerQuery is Jaeger's query API.
	JaegerQuery string
	// Prometheus is Prometheus's HTTP API.
	Prometheus string
	// Dir is the sandbox's directory (Options.Dir): the programs' logs in Dir/logs,
	// the CloudEvents the sinks got, the executor's configuration, Jaeger's and NATS's files.
	Dir string
	// Kubeconfig reaches the cluster as its administrator.
	Kubeconfig string
	// NodeDir is the directory of the real node the sandbox started (its pods' logs under
	// kubelet/pod-logs), or "" when it started none.
	NodeDir string
	// DatabaseURL is the database both services keep their tables in.
	DatabaseURL string
	// ExampleSecret is the value of the Secret the examples read, made at random for
	// this run, so that a test can look for it where it must never be.
	ExampleSecret string
}

func (o Options) withDefaults() Options {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&o.EventsPort, 8090)
	def(&o.CachePort, 8094)
	def(&o.ExecutorHealthPort, 8081)
	def(&o.ExecutorMetricsPort, 10254)
	def(&o.JaegerQueryPort, 16686)
	def(&o.JaegerOTLPPort, 4318)
	def(&o.EventsMetricsPort, 9090)
	def(&o.CacheMetricsPort, 9094)
	def(&o.ConsolePort, 8092)
	def(&o.PrometheusPort, 9091)
	def(&o.NATSPort, 4222)
	def(&o.CloudEventsReceiverPort, 8096)
	def(&o.SecondExecutorHealthPort, 8082)
	def(&o.SecondExecutorMetricsPort, 10255)
	if o.Dir == "" {
		o.Dir = DefaultDir()
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	if o.CredentialsDir == "" {
		o.CredentialsDir = filepath.Join(cacheDir(), "dev-credentials")
	}
	return o
}

// DefaultDir is the sandbox's directory when Options name none (the examples name it).
func DefaultDir() string { return filepath.Join(os.TempDir(), "flyte-sandbox") }

// cacheDir is where what outlives a run is kept: binaries, credentials.
func cacheDir() string {
	if d := os.Getenv("FLYTE_CACHE_DIR"); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return filepath.Join(cache, "flyte-executor")
}

// demoNamespace is where the examples run.
const demoNamespace = "demo"

// Run brings the system up, applies the examples and shows them running until ctx ends
// (or, with UntilSettled, until they have all ended), then stops everything it started.
func Run(ctx context.Context, o Options, out io.Writer) (err error) {
	o = o.withDefaults()
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	var stops []func()
	defer func() {
		if len(stops) > 0 {
			say("stopping")
		}
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	root, err := repo.Root()
	if err != nil {
		return err
	}
	logs := filepath.Join(o.Dir, "logs")
	for _, d := range []string{logs, filepath.Join(o.Dir, "inputs"), filepath.Join(o.Dir, "outputs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}

	bins, err := build(ctx, root, say)
	if err != nil {
		return err
	}

	first, err := controlPlane(o, root, say)
	if err != nil {
		return err
	}
	stops = append(stops, first.stop)
	restConfig, kubeconfig, pods := first.config, first.kubeconfig, first.pods

	say("starting Postgres")
	pg, err := pgtest.Start()
	if err != nil {
		return err
	}
	stops = append(stops, func() { _ = pg.Stop() })
	dbURL, err := database(ctx, pg.URL)
	if err != nil {
		return err
	}

	say("starting NATS with JetStream on 127.0.0.1:%d, stream %s, and the CloudEvents receiver on 127.0.0.1:%d", o.NATSPort, natsStream, o.CloudEventsReceiverPort)
	egress, err := startEgress(ctx, o, bins["nats-server"], logs, &stops)
	if err != nil {
		return err
	}

	say("starting Jaeger")
	jaegerDir := filepath.Join(o.Dir, "jaeger")
	if err := jaeger(ctx, root, "build"); err != nil {
		return err
	}
	// The ports nothing here reaches are any free ones, so that two sandboxes (make run
	// beside make test) do not collide on Jaeger's defaults.
	if err := jaeger(ctx, root, "start", jaegerDir, "JAEGER_QUERY_PORT="+strconv.Itoa(o.JaegerQueryPort),
		"JAEGER_OTLP_HTTP_PORT="+strconv.Itoa(o.JaegerOTLPPort), "JAEGER_OTLP_GRPC_PORT=0", "JAEGER_QUERY_GRPC_PORT=0",
		"JAEGER_HEALTH_PORT=0", "JAEGER_METRICS_PORT=0"); err != nil {
		return err
	}
	stops = append(stops, func() { _ = jaeger(context.Background(), root, "stop", jaegerDir) })
	otel := func(service string) []string {
		return []string{"OTEL_SERVICE_NAME=" + service, "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:" + strconv.Itoa(o.JaegerOTLPPort),
			"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"}
	}

	// The services speak TLS and want a token, as in a cluster; the credentials are
	// made once and kept, so a CA or a token a user copied stays good.
	creds, err := devcreds.Ensure(o.CredentialsDir)
	if err != nil {
		return err
	}
	if len(creds.Generated) > 0 {
		say("made credentials in %s: %s", creds.Dir, strings.Join(creds.Generated, ", "))
	} else {
		say("using the credentials in %s", creds.Dir)
	}
	tlsClient, err := rpcclient.New(rpcclient.Options{CAFile: creds.CAFile, Timeout: 5 * time.Second})
	if err != nil {
		return err
	}

	eventsAddr, cacheAddr := "127.0.0.1:"+strconv.Itoa(o.EventsPort), "127.0.0.1:"+strconv.Itoa(o.CachePort)
	// Plain HTTP on the loopback, for the user's browser, which does not trust our CA.
	console := []string{"--console-listen", "127.0.0.1:" + strconv.Itoa(o.ConsolePort), "--console-plaintext",
		"--jaeger-query-url", "http://127.0.0.1:" + strconv.Itoa(o.JaegerQueryPort)}
	for _, svc := range []struct {
		name, bin, addr string
		metricsPort     int
		extra           []string
	}{
		{"events", bins["events"], eventsAddr, o.EventsMetricsPort, append(console, egress.sinkFlags()...)},
		{"cacheservice", bins["cacheservice"], cacheAddr, o.CacheMetricsPort, nil},
	} {
		say("starting %s on %s", svc.name, svc.addr)
		p, err := startProcess(svc.name, svc.bin, logs, append(otel(svc.name), "DATABASE_URL="+dbURL), append([]string{
			"--listen", svc.addr, "--metrics-listen", "127.0.0.1:" + strconv.Itoa(svc.metricsPort),
			"--tls-cert-file", creds.CertFile, "--tls-key-file", creds.KeyFile,
			"--auth-mode", "token-file", "--auth-token-file", creds.TokensFile}, svc.extra...)...)
		if err != nil {
			return err
		}
		stops = append(stops, stopFunc(p))
		if err := p.WaitHTTP(ctx, tlsClient, "https://"+svc.addr+"/healthz", time.Minute); err != nil {
			return err
		}
	}
	// The verdict reads what the events service holds as a viewer would.
	viewer, err := rpcclient.New(rpcclient.Options{CAFile: creds.CAFile, TokenFile: creds.ViewerTokenFile, Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	eventsClient := eventsv1connect.NewEventsServiceClient(viewer, "https://"+eventsAddr)

	say("starting the executor")
	cfg := config.Default()
	cfg.EventsServiceURL, cfg.CacheServiceURL = "https://"+eventsAddr, "https://"+cacheAddr
	cfg.ServiceCAFile, cfg.ServiceTokenFile = creds.CAFile, creds.ExecutorTokenFile
	cfg.HealthProbeBindAddress = "127.0.0.1:" + strconv.Itoa(o.ExecutorHealthPort)
	cfg.MetricsBindAddress = "127.0.0.1:" + strconv.Itoa(o.ExecutorMetricsPort)
	cfg.MetricsSecure = false                                          // plain HTTP on the loopback, so curl can read it
	cfg.RetryBackoff.Base = metav1.Duration{Duration: 2 * time.Second} // retries a person can watch
	cfg.Cluster = "sandbox"
	// An hour of finished actions, so that the printed kubectl commands show the
	// examples for as long as someone is likely to look.
	cfg.GC.MaxTTL = metav1.Duration{Duration: time.Hour}
	// The examples' inputs and outputs, and nothing else of the directory (its
	// kubeconfig least of all): file:// is refused unless a prefix names it.
	cfg.Storage.AllowedPrefixes = []string{"file://" + filepath.ToSlash(filepath.Join(o.Dir, "inputs")), "file://" + filepath.ToSlash(filepath.Join(o.Dir, "outputs"))}
	// On the node started here, pods share this machine's disk with the executor: the
	// container examples read and write the examples' file:// data where it lies.
	cfg.K8s.MountFileStorage = pods && o.Kubeconfig == ""
	e, err := systemtest.NewExecutor(systemtest.ExecutorOptions{Name: "executor", Binary: bins["executor"], LogDir: logs,
		ConfigFile: filepath.Join(o.Dir, "executor.yaml"), Config: cfg, Kubeconfig: kubeconfig, Env: otel("executor")})
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := start(e.Process); err != nil {
		return err
	}
	stops = append(stops, stopFunc(e.Process))
	if err := e.WaitHTTP(ctx, http.DefaultClient, e.Readyz, time.Minute); err != nil {
		return err
	}

	var second *cluster // the second cluster, when asked for
	if o.SecondCluster {
		if second, err = startSecondCluster(ctx, o, root, cfg, bins["executor"], logs, otel(SecondClusterName), say); err != nil {
			return err
		}
		stops = append(stops, second.stop)
	}

	say("starting Prometheus on 127.0.0.1:%d", o.PrometheusPort)
	if err := startPrometheus(ctx, root, bins["prometheus"], o, &stops); err != nil {
		return err
	}

	scheme, err := executor.Scheme()
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	examples, err := loadExamples(filepath.Join(root, "examples"))
	if err != nil {
		return err
	}
	if !pods {
		var left []string
		examples, left = withoutPods(examples)
		if len(left) > 0 {
			say("left out, for want of a node to run their pods: %s", strings.Join(left, ", "))
		}
	}
	var clients []client.WithWatch // the clusters', the first one's first
	clients = append(clients, c)
	if second == nil {
		var left []string
		examples, left = withoutSecondCluster(examples)
		if len(left) > 0 {
			say("left out, for want of a second cluster (make run CLUSTERS=2): %s", strings.Join(left, ", "))
		}
	} else {
		c2, err := client.NewWithWatch(second.config, client.Options{Scheme: scheme})
		if err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		if err := inSecondCluster(ctx, c2, examples); err != nil {
			return err
		}
		clients = append(clients, c2)
	}
	secret, err := prepareExamples(ctx, c, root, o.Dir, examples)
	if err != nil {
		return err
	}
	say("applying %d TaskActions from examples/ to namespace %s\n", len(examples), demoNamespace)
	if err := apply(ctx, c, examples); err != nil {
		return err
	}
	say("%s\n", whereToLook(o, kubeconfig, logs, creds, egress))
	endpoints := Endpoints{
		EventsMetrics:   fmt.Sprintf("http://127.0.0.1:%d/metrics", o.EventsMetricsPort),
		CacheMetrics:    fmt.Sprintf("http://127.0.0.1:%d/metrics", o.CacheMetricsPort),
		ExecutorMetrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", o.ExecutorMetricsPort),
		JaegerQuery:     fmt.Sprintf("http://127.0.0.1:%d", o.JaegerQueryPort),
		Prometheus:      fmt.Sprintf("http://127.0.0.1:%d", o.PrometheusPort),
		Dir:             o.Dir, Kubeconfig: kubeconfig, NodeDir: first.nodeDir, DatabaseURL: dbURL, ExampleSecret: secret,
	}
	return watchExamples(ctx, clients, examples, o, endpoints, out, func(ctx context.Context) error {
		return checkEgress(ctx, eventsClient, egress, out)
	})
}

// build compiles the three programs and nats-server from the module go.mod requires, and
// Prometheus from its own (tools/prometheus, as promtool is): minutes the first time, then
// seconds, from Go's build cache.
func build(ctx context.Context, root string, say func(string, ...any)) (map[string]string, error) {
	binDir := filepath.Join(cacheDir(), "sandbox-bin")
	goBuild := func(args ...string) func() error {
		return func() error {
			cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", binDir + "/"}, args...)...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("sandbox: go build %s: %w\n%s", strings.Join(args, " "), err, out)
			}
			return nil
		}
	}
	if err := longStep(say, "building the events service, the cache service, the executor and nats-server", firstBuildPrograms, heartbeat,
		goBuild("./events/cmd/events", "./cacheservice/cmd/cacheservice", "./executor/cmd/executor", "github.com/nats-io/nats-server/v2")); err != nil {
		return nil, err
	}
	if err := longStep(say, "building Prometheus", firstBuildPrometheus, heartbeat,
		goBuild("-modfile=tools/prometheus/go.mod", "github.com/prometheus/prometheus/cmd/prometheus")); err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, name := range []string{"events", "cacheservice", "executor", "nats-server", "prometheus"} {
		bins[name] = filepath.Join(binDir, name)
	}
	return bins, nil
}

// cluster is the Kubernetes the sandbox uses.
type cluster struct {
	config     *rest.Config
	kubeconfig string
	// pods says whether pods can run.
	pods bool
	// nodeDir is the directory of the node the sandbox started, if it started one.
	nodeDir string
	stop    func()
}

// controlPlane connects to the cluster o.Kubeconfig names and installs the CRD there,
// or starts a real single-node Kubernetes where this machine can run one (as root), or
// else the embedded kube-apiserver and etcd, which run no pods.
func controlPlane(o Options, root string, say func(string, ...any)) (*cluster, error) {
	crds := filepath.Join(root, "deploy", "crd")
	if o.Kubeconfig != "" {
		say("using the cluster of %s", o.Kubeconfig)
		cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		c, err := client.New(cfg, client.Options{})
		if err == nil {
			err = kubetest.ApplyCRD(context.Background(), c, filepath.Join(crds, "flyte.org_taskactions.yaml"), "flyte-sandbox")
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		ready, err := readyNodes(cfg)
		if err != nil {
			return nil, err
		}
		if ready == 0 {
			say("the cluster has no Ready node, so only in-process tasks run")
		}
		return &cluster{config: cfg, kubeconfig: o.Kubeconfig, pods: ready > 0, stop: func() {}}, nil
	}
	scheme, err := executor.Scheme()
	if err != nil {
		return nil, err
	}
	why := nodetest.Unavailable()
	if o.NoNode {
		why = "--no-node"
	}
	if why == "" {
		say("starting a real single-node Kubernetes: etcd, kube-apiserver, controller manager, scheduler, containerd and kubelet on 127.0.0.1 (hack/node.sh; built the first time)")
		node, err := nodetest.Start(nodetest.Options{CRDDirectoryPaths: []string{crds}, Scheme: scheme})
		if err != nil {
			return nil, err
		}
		say("the node's processes log to %s", filepath.Join(node.Dir, "logs"))
		return &cluster{config: node.Config, kubeconfig: filepath.Join(node.Dir, "admin.kubeconfig"), pods: true, nodeDir: node.Dir,
			stop: func() { _ = node.Stop() }}, nil
	}
	say("starting the embedded control plane (kube-apiserver and etcd; built from the Go module proxy the first time); no node (%s), so only in-process tasks run", why)
	env, err := kubetest.Start(kubetest.Options{CRDDirectoryPaths: []string{crds}, Scheme: scheme})
	if err != nil {
		return nil, err
	}
	stop := func() { _ = env.Stop() }
	raw, err := env.Kubeconfig()
	if err == nil {
		err = os.WriteFile(filepath.Join(o.Dir, "kubeconfig"), raw, 0o600)
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return &cluster{config: env.Config, kubeconfig: filepath.Join(o.Dir, "kubeconfig"), stop: stop}, nil
}

// readyNodes counts the cluster's Ready nodes.
func readyNodes(cfg *rest.Config) (int, error) {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return 0, fmt.Errorf("sandbox: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return 0, fmt.Errorf("sandbox: listing nodes: %w", err)
	}
	ready := 0
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	return ready, nil
}

// database creates the sandbox's database on the throwaway cluster (both services
// migrate their own tables in it) and returns its URL.
func database(ctx context.Context, maintenanceURL string) (string, error) {
	conn, err := pgx.Connect(ctx, maintenanceURL)
	if err != nil {
		return "", fmt.Errorf("sandbox: connecting to Postgres: %w", err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE flyte"); err != nil && !strings.Contains(err.Error(), "already exists") {
		return "", fmt.Errorf("sandbox: creating the database: %w", err)
	}
	u, err := url.Parse(maintenanceURL)
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	u.Path = "/flyte"
	return u.String(), nil
}

// jaeger runs hack/jaeger.sh with a verb and, after a directory, port settings.
func jaeger(ctx context.Context, root, verb string, args ...string) error {
	cmdArgs, env := []string{verb}, os.Environ()
	for _, a := range args {
		if strings.Contains(a, "=") {
			env = append(env, a)
		} else {
			cmdArgs = append(cmdArgs, a)
		}
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "jaeger.sh"), cmdArgs...)
	cmd.Env = env
	if verb == "build" { // minutes the first time: let its progress show
		cmd.Stderr = os.Stderr
		if _, err := cmd.Output(); err != nil {
			return fmt.Errorf("sandbox: hack/jaeger.sh build: %w", err)
		}
		return nil
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("sandbox: hack/jaeger.sh %s: %w\n%s", verb, err, out)
	}
	return nil
}

// prepareExamples makes the namespace, the Secret and the input files the examples
// name, and returns the Secret's value.
func prepareExamples(ctx context.Context, c client.Client, root, dir string, examples []*example) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("sandbox: creating namespace %s: %w", demoNamespace, err)
	}
	secret, err := makeExampleSecret(ctx, c)
	if err != nil {
		return "", err
	}
	inputs, err := filepath.Glob(filepath.Join(root, "examples", "inputs", "*"))
	if err != nil {
		return "", err
	}
	for _, in := range inputs {
		raw, err := os.ReadFile(in)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "inputs", filepath.Base(in)), raw, 0o644)
		}
		if err != nil {
			return "", fmt.Errorf("sandbox: %w", err)
		}
	}
	// The examples name the default directory; a sandbox elsewhere moves their URIs.
	const named = "file:///tmp/flyte-sandbox/"
	for _, e := range examples {
		spec := &e.action.Spec
		for _, uri := range []*string{&spec.InputURI, &spec.RunOutputBase} {
			if rest, ok := strings.CutPrefix(*uri, named); ok {
				*uri = "file://" + filepath.ToSlash(dir) + "/" + rest
			}
		}
	}
	// A sandbox run again finds the examples of the last run: start them afresh.
	for _, e := range examples {
		err := c.Delete(ctx, e.action.DeepCopy())
		if err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("sandbox: removing the last run's %s: %w", e.action.Name, err)
		}
	}
	return secret, nil
}

// watchExamples shows the examples' progress as the API servers of clients (the first
// cluster's first) report it, until ctx ends or, with UntilSettled, until every example
// has ended. With UntilSettled, verify then holds the rest of the system to what the
// examples did.
func watchExamples(ctx context.Context, clients []client.WithWatch, examples []*example, o Options, endpoints Endpoints, out io.Writer, verify func(context.Context) error) error {
	view := newProgress(out, o.Terminal)
	var mu sync.Mutex // examples and view, shared by the watch and the clock
	show := func() {
		mu.Lock()
		defer mu.Unlock()
		view.show(examples, time.Now())
	}
	// step takes what changed, applies the examples now due, redraws, and says whether
	// the watch is over.
	var applyErr error
	step := func(changed ...*flytev1.TaskAction) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, ta := range changed {
			observe(examples, ta)
		}
		if applyErr = apply(ctx, clients[0], examples); applyErr != nil {
			return false, applyErr
		}
		view.show(examples, time.Now())
		done, _ := settled(examples)
		return o.UntilSettled && done, nil
	}
	var timeout time.Duration // none: until ctx ends
	if o.UntilSettled {
		timeout = o.Timeout
	}
	watchCtx, cancel := watchtools.ContextWithOptionalTimeout(ctx, timeout)
	defer cancel()
	if o.Terminal { // the AGE column moves on between changes
		clockCtx, stopClock := context.WithCancel(watchCtx)
		var clock sync.WaitGroup
		clock.Go(func() { wait.UntilWithContext(clockCtx, func(context.Context) { show() }, time.Second) })
		defer clock.Wait()
		defer stopClock()
	}

	// One watch a cluster; the first to see every example ended ends them all.
	allCtx, allEnded := context.WithCancel(watchCtx)
	defer allEnded()
	errs := make([]error, len(clients))
	var watches sync.WaitGroup
	for i, c := range clients {
		watches.Go(func() {
			errs[i] = watchCluster(allCtx, c, func(changed ...*flytev1.TaskAction) (bool, error) {
				done, err := step(changed...)
				if done {
					allEnded()
				}
				return done, err
			})
		})
	}
	watches.Wait()
	err := errors.Join(errs...)
	switch {
	case ctx.Err() != nil:
		return nil
	case watchCtx.Err() != nil:
		return fmt.Errorf("sandbox: the examples did not all end within %s", o.Timeout)
	case applyErr != nil:
		return applyErr
	case err != nil && allCtx.Err() == nil:
		return fmt.Errorf("sandbox: watching the examples: %w", err)
	}
	if _, problems := settled(examples); len(problems) > 0 {
		return fmt.Errorf("sandbox: not as expected: %s", strings.Join(problems, "; "))
	}
	fmt.Fprintln(out, "every example ended as expected")
	if err := verify(ctx); err != nil {
		return err
	}
	if o.Settled == nil {
		return nil
	}
	return o.Settled(ctx, endpoints)
}

// watchCluster hands step the examples of one cluster as they change, until step says
// the watch is over or ctx ends.
func watchCluster(ctx context.Context, c client.WithWatch, step func(...*flytev1.TaskAction) (bool, error)) error {
	demo := client.InNamespace(demoNamespace)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list := &flytev1.TaskActionList{}
			return list, c.List(ctx, list, demo, &client.ListOptions{Raw: &opts})
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, &flytev1.TaskActionList{}, demo, &client.ListOptions{Raw: &opts})
		},
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &flytev1.TaskAction{},
		func(store toolscache.Store) (bool, error) { // what exists once the watch begins
			var all []*flytev1.TaskAction
			for _, obj := range store.List() {
				all = append(all, obj.(*flytev1.TaskAction))
			}
			return step(all...)
		},
		func(ev watch.Event) (bool, error) {
			ta, ok := ev.Object.(*flytev1.TaskAction)
			if !ok || ev.Type == watch.Deleted {
				return false, nil
			}
			return step(ta)
		})
	return err
}

func writeYAML(path string, v any) error {
	raw, err := yaml.Marshal(v)
	if err == nil {
		err = os.WriteFile(path, raw, 0o644)
	}
	if err != nil {
		return fmt.Errorf("sandbox: writing %s: %w", path, err)
	}
	return nil
}

func whereToLook(o Options, kubeconfig, logs string, creds *devcreds.Credentials, egress *egress) string {
	q := strconv.Itoa(o.JaegerQueryPort)
	lines := []string{
		"Where to look (while the sandbox runs):",
		// The fragment hands the page a viewer's token without sending it to a server.
		fmt.Sprintf("  console: http://127.0.0.1:%d/console/?project=demo&domain=development#token=%s   (with a viewer's token, kept for the browser session)", o.ConsolePort, creds.ViewerToken),
		"  kubectl --kubeconfig " + kubeconfig + " -n demo get taskactions",
		"  kubectl --kubeconfig " + kubeconfig + " -n demo get taskaction flaky -o yaml   # the phase history of every attempt",
		"  # TLS from the sandbox's CA, and a viewer's token (read only); executor.token beside it may write",
		fmt.Sprintf(`  alias bufcurl='go tool -modfile=tools/go.mod buf curl --protocol grpc --cacert "%s" -H "Authorization: Bearer $(cat "%s")" --reflect-header "*"'`, creds.CAFile, creds.ViewerTokenFile),
		"  # and an operator's token, for the CloudEvents egress (viewers may not list its sinks)",
		fmt.Sprintf(`  alias bufcurl-operator='go tool -modfile=tools/go.mod buf curl --protocol grpc --cacert "%s" -H "Authorization: Bearer $(cat "%s")" --reflect-header "*"'`, creds.CAFile, creds.OperatorTokenFile),
		fmt.Sprintf("  bufcurl -d '{\"project\":\"demo\",\"domain\":\"development\"}' https://127.0.0.1:%d/flyte.events.v1.EventsService/ListActions", o.EventsPort),
		fmt.Sprintf("  bufcurl -d '{\"id\":{\"project\":\"demo\",\"domain\":\"development\",\"run\":\"flaky\",\"action\":\"flaky\"}}' https://127.0.0.1:%d/flyte.events.v1.EventsService/ListActionEvents", o.EventsPort),
		fmt.Sprintf("  bufcurl --list-methods https://127.0.0.1:%d", o.CachePort),
		fmt.Sprintf("  bufcurl-operator -d '{}' https://127.0.0.1:%d/flyte.events.v1.EgressService/ListSinks   # the CloudEvents sinks, each with its backlog and dead letters", o.EventsPort),
		fmt.Sprintf("  CloudEvents, one JSON line each, as the HTTP receiver (%s) got them: %s", egress.receiverURL, egress.http.path),
		fmt.Sprintf("  and as a JetStream consumer of stream %s (subject %s on %s) got them: %s", natsStream, natsSubject, egress.natsURL, egress.nats.path),
		"  Jaeger: http://127.0.0.1:" + q + "  (a build from the module proxy has no UI; its API: http://127.0.0.1:" + q + "/api/traces?service=executor)",
		fmt.Sprintf("  metrics: http://127.0.0.1:%d/metrics (executor), http://127.0.0.1:%d/metrics (events), http://127.0.0.1:%d/metrics (cacheservice)",
			o.ExecutorMetricsPort, o.EventsMetricsPort, o.CacheMetricsPort),
		fmt.Sprintf("  Prometheus: http://127.0.0.1:%d, scraping the three every 5 s with the alert rules loaded (a build from the module proxy has no UI; its API: http://127.0.0.1:%d/api/v1/targets, /api/v1/alerts, /api/v1/query?query=flyte_executor_actions)",
			o.PrometheusPort, o.PrometheusPort),
		"  logs: " + logs,
	}
	if o.SecondCluster {
		second := filepath.Join(o.Dir, SecondClusterName+".kubeconfig")
		lines = append(lines,
			fmt.Sprintf("The second cluster, %s, which reports to the same services (its actions' events name it; the console's Cluster filter shows them apart):", SecondClusterName),
			"  kubectl --kubeconfig "+second+" -n demo get taskactions",
			fmt.Sprintf("  its executor's metrics: http://127.0.0.1:%d/metrics, its log: %s", o.SecondExecutorMetricsPort, filepath.Join(logs, "executor-"+SecondClusterName+".log")))
	}
	if !o.UntilSettled {
		lines = append(lines, "Ctrl-C stops everything.")
	}
	return strings.Join(lines, "\n")
}

// SecondClusterName names the second cluster, in its executor's events.
const SecondClusterName = "sandbox-2"

// startSecondCluster starts the second cluster: an embedded control plane (no node: its
// examples run in process) and an executor of its own, configured as the first's (cfg)
// but for its name, ports and kubeconfig, so that it reports to the same services and
// shares the data store.
func startSecondCluster(ctx context.Context, o Options, root string, cfg config.Config, bin, logs string, env []string, say func(string, ...any)) (*cluster, error) {
	say("starting a second cluster, %s: an embedded control plane (kube-apiserver and etcd, no node) and its executor", SecondClusterName)
	scheme, err := executor.Scheme()
	if err != nil {
		return nil, err
	}
	kube, err := kubetest.Start(kubetest.Options{CRDDirectoryPaths: []string{filepath.Join(root, "deploy", "crd")}, Scheme: scheme})
	if err != nil {
		return nil, err
	}
	second := &cluster{config: kube.Config, kubeconfig: filepath.Join(o.Dir, SecondClusterName+".kubeconfig")}
	stops := []func(){func() { _ = kube.Stop() }}
	second.stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	fail := func(err error) (*cluster, error) {
		second.stop()
		return nil, err
	}
	raw, err := kube.Kubeconfig()
	if err == nil {
		err = os.WriteFile(second.kubeconfig, raw, 0o600)
	}
	if err != nil {
		return fail(fmt.Errorf("sandbox: %w", err))
	}
	cfg.Cluster = SecondClusterName
	cfg.HealthProbeBindAddress = "127.0.0.1:" + strconv.Itoa(o.SecondExecutorHealthPort)
	cfg.MetricsBindAddress = "127.0.0.1:" + strconv.Itoa(o.SecondExecutorMetricsPort)
	cfg.K8s.MountFileStorage = false
	e, err := systemtest.NewExecutor(systemtest.ExecutorOptions{Name: "executor-" + SecondClusterName, Binary: bin, LogDir: logs,
		ConfigFile: filepath.Join(o.Dir, "executor-"+SecondClusterName+".yaml"), Config: cfg, Kubeconfig: second.kubeconfig, Env: env})
	if err != nil {
		return fail(fmt.Errorf("sandbox: %w", err))
	}
	if err := start(e.Process); err != nil {
		return fail(err)
	}
	stops = append(stops, stopFunc(e.Process))
	if err := e.WaitHTTP(ctx, http.DefaultClient, e.Readyz, time.Minute); err != nil {
		return fail(err)
	}
	return second, nil
}
