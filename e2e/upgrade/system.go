package upgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/process"
	"github.com/flytekube/backend/test/systemtest"
)

// The executors' leader-election lock, the same for both releases: the new executor
// waits as a standby until the old one hands the lease over.
const (
	leaderNS       = "upgrade-system"
	leaderLockName = "upgrade.flyte.org"
)

// release names the programs of one side of the upgrade, and its CRD.
type release struct {
	name string // v0.1.0, or "tree"
	bins map[string]string
	crd  string
	// sinkConfig says its events service takes --cloudevents-config.
	sinkConfig bool
}

// service is one of the two services: its address (a balancer standing in for its
// Kubernetes Service) and its replicas of each release.
type service struct {
	name     string // events, cacheservice
	lb       *balancer
	replicas map[string]*replica // by release name
	// stopped counts the replicas stopped: each stop of an events replica may hand the
	// CloudEvents relay to another.
	stopped int
}

// replica is one process of a service.
type replica struct {
	proc   *process.Process
	addr   string // host:port
	health string
}

// system is what the test runs: the control plane and Postgres of one cluster, the
// services behind their balancers, and the executors.
type system struct {
	dir, logs, dataDir string
	creds              *devcreds.Credentials
	cp                 *systemtest.ControlPlane
	client             client.WithWatch
	dbURL              string
	sink               *sink
	svcClient          *http.Client // trusts the test's CA; for health checks
	events, cache      *service
	executors          map[string]*process.Process // by release name
	execHealth         map[string]string           // /readyz
	execMetrics        map[string]string           // /metrics
	// all are every program started, stopped ones included, for the check of exits the
	// test did not cause.
	all []*process.Process
	log func(string, ...any)
	// node is the real node the pods run on; nil where the stand-in kubelet plays it
	// (standIn, started by the first runPods; stopPods ends it).
	node        *systemtest.Node
	standIn     *standIn
	stopPods    context.CancelFunc
	kubeletDone sync.WaitGroup
}

// newSystem starts the control plane, makes the cluster's namespaces and, with node
// systemtest.NodeReal, attaches a real node to it; Postgres is the caller's (dbURL).
func newSystem(ctx context.Context, dir, assets, dbURL, node string, log func(string, ...any)) (s *system, err error) {
	s = &system{dir: dir, logs: filepath.Join(dir, "logs"), dataDir: filepath.Join(dir, "data"), dbURL: dbURL, log: log,
		executors: map[string]*process.Process{}, execHealth: map[string]string{}, execMetrics: map[string]string{}}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	for _, d := range []string{s.logs, filepath.Join(s.dataDir, "inputs"), filepath.Join(s.dataDir, "outputs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return s, fmt.Errorf("system: %w", err)
		}
	}
	if s.creds, err = devcreds.Ensure(filepath.Join(dir, "creds")); err != nil {
		return s, err
	}
	if s.cp, err = systemtest.StartControlPlane(ctx, assets, dir, s.logs, s.creds); err != nil {
		return s, err
	}
	scheme, err := executor.Scheme()
	if err != nil {
		return s, err
	}
	if s.client, err = client.NewWithWatch(s.cp.Config, client.Options{Scheme: scheme}); err != nil {
		return s, fmt.Errorf("system: client: %w", err)
	}
	for _, ns := range []string{namespace, leaderNS} {
		if err := s.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return s, fmt.Errorf("system: creating namespace %s: %w", ns, err)
		}
	}
	log("control plane up at %s", s.cp.URL)
	if s.node, err = systemtest.StartNode(ctx, node, s.client, dir, s.cp.Kubeconfig, log); err != nil {
		return s, err
	}
	if s.svcClient, err = rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, Timeout: 5 * time.Second}); err != nil {
		return s, err
	}
	s.sink = newSink()
	s.events, s.cache = &service{name: "events", replicas: map[string]*replica{}}, &service{name: "cacheservice", replicas: map[string]*replica{}}
	for _, svc := range []*service{s.events, s.cache} {
		if svc.lb, err = newBalancer(); err != nil {
			return s, err
		}
	}
	return s, nil
}

// url is a service's address as its clients reach it.
func (svc *service) url() string { return "https://" + svc.lb.addr() }

// startReplica starts a service's replica of release r beside those running, waits for
// its health check (a new release applies its migrations first), and puts it in
// rotation. A replica that exits before it is ready is started again, as its pod's
// container would be, up to startTries times; the check of exits names each.
func (s *system) startReplica(ctx context.Context, svc *service, r release) (*replica, error) {
	p, err := ports.Free(2)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(p[0])
	args := []string{"--listen", addr, "--metrics-listen", "127.0.0.1:" + strconv.Itoa(p[1]),
		"--tls-cert-file", s.creds.CertFile, "--tls-key-file", s.creds.KeyFile,
		"--auth-mode", "token-file", "--auth-token-file", s.creds.TokensFile}
	if svc == s.events {
		if r.sinkConfig {
			path, err := s.sink.configFile(s.dir)
			if err != nil {
				return nil, err
			}
			args = append(args, "--cloudevents-config", path)
		} else {
			args = append(args, "--cloudevents-sink", s.sink.flagURL())
		}
	}
	rep := &replica{addr: addr, health: "https://" + addr + "/healthz",
		proc: process.New(svc.name+"-"+r.name, r.bins[svc.name], s.logs,
			[]string{"DATABASE_URL=" + s.dbURL, "OTEL_SDK_DISABLED=true"}, args...)}
	if err := rep.proc.Start(); err != nil {
		return nil, err
	}
	svc.replicas[r.name] = rep
	s.all = append(s.all, rep.proc)
	for try := 1; ; try++ {
		err := rep.proc.WaitHTTP(ctx, s.svcClient, rep.health, 5*time.Minute)
		if err == nil {
			break
		}
		if rep.proc.Running() || try == startTries || ctx.Err() != nil {
			return nil, err
		}
		s.log("%s exited before it was ready (%s); starting it again, as its pod's restart would", rep.proc.Name, lastError(rep.proc.Log, time.Now()))
		if err := rep.proc.Start(); err != nil {
			return nil, err
		}
	}
	svc.lb.set(svc.addrs()...)
	return rep, nil
}

// stopReplica takes a replica out of rotation and stops it gracefully, as a rolling
// update ends an old pod.
func (s *system) stopReplica(svc *service, release string) {
	rep := svc.replicas[release]
	if rep == nil {
		return
	}
	delete(svc.replicas, release)
	svc.lb.set(svc.addrs()...)
	rep.proc.Stop(30 * time.Second)
	svc.stopped++
}

func (svc *service) addrs() []string {
	var out []string
	for _, rep := range svc.replicas {
		out = append(out, rep.addr)
	}
	return out
}

// executorConfig is the executor's file, in the fields both releases read (the file is
// read strictly: a field the old release lacks would stop it): leader election on, the
// test's namespace, retries quick enough for a short test, finished actions kept for
// the checks.
func (s *system) executorConfig(health, metrics int) map[string]any {
	return map[string]any{
		"leaderElect": true, "leaderElectionID": leaderLockName, "leaderElectionNamespace": leaderNS,
		"namespaces":       []string{namespace},
		"eventsServiceURL": s.events.url(), "cacheServiceURL": s.cache.url(),
		"serviceTokenFile": s.creds.ExecutorTokenFile, "serviceCAFile": s.creds.CAFile,
		"healthProbeBindAddress": "127.0.0.1:" + strconv.Itoa(health),
		"metricsBindAddress":     "127.0.0.1:" + strconv.Itoa(metrics), "metricsSecure": false,
		"retryBackoff": map[string]any{"base": "200ms", "cap": "2s"},
		"cluster":      "upgrade",
		"storage":      map[string]any{"allowedPrefixes": []string{"file://" + filepath.ToSlash(s.dataDir)}},
		"gc":           map[string]any{"interval": "1m", "maxTTL": "1h"},
	}
}

// startExecutor starts release r's executor and waits until it is ready (a standby is
// ready too: readiness does not wait for the lease).
func (s *system) startExecutor(ctx context.Context, r release) error {
	p, err := ports.Free(2)
	if err != nil {
		return err
	}
	e, err := systemtest.NewExecutor(systemtest.ExecutorOptions{Name: "executor-" + r.name, Binary: r.bins["executor"], LogDir: s.logs,
		ConfigFile: filepath.Join(s.dir, "executor-"+r.name+".yaml"), Config: s.executorConfig(p[0], p[1]),
		Kubeconfig: s.cp.Kubeconfig, Env: []string{"OTEL_SDK_DISABLED=true"}})
	if err != nil {
		return fmt.Errorf("system: %w", err)
	}
	s.executors[r.name] = e.Process
	s.all = append(s.all, e.Process)
	s.execHealth[r.name], s.execMetrics[r.name] = e.Readyz, e.Metrics
	if err := e.Start(); err != nil {
		return err
	}
	return e.WaitHTTP(ctx, http.DefaultClient, e.Readyz, 2*time.Minute)
}

// waitLeader waits until release r's executor holds the lease.
func (s *system) waitLeader(ctx context.Context, r string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !systemtest.IsLeader(ctx, s.execMetrics[r]) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("executor-%s did not become the leader within %s; see %s", r, timeout, s.executors[r].Log)
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return nil
}

// runPods readies plans' container actions to run, before they are created: on the
// real node, with its image; else the stand-in kubelet, started by the first call and
// running until stop, learns how each ends. Called again, it adds the new plans.
func (s *system) runPods(ctx context.Context, plans []*plan) {
	if s.node != nil {
		for _, p := range plans {
			if c := p.action.Spec.Container; c != nil {
				c.Image = s.node.Image
			}
		}
		return
	}
	if s.standIn == nil {
		s.standIn = newStandIn()
		var kctx context.Context
		kctx, s.stopPods = context.WithCancel(ctx)
		kubelet := systemtest.NewKubelet(s.client, func() []*corev1.Pod { return pods(kctx, s) }, 1, s.standIn.exitCode,
			func(string, *corev1.Pod) error { return nil })
		kubelet.RunFor = s.standIn.runFor
		s.kubeletDone.Go(func() { kubelet.Run(kctx) })
	}
	s.standIn.add(plans)
}

// stop takes everything down, programs first.
func (s *system) stop() {
	if s.stopPods != nil {
		s.stopPods()
		s.kubeletDone.Wait()
	}
	for _, e := range s.executors {
		e.Stop(15 * time.Second)
	}
	for _, svc := range []*service{s.events, s.cache} {
		if svc == nil {
			continue
		}
		for _, rep := range svc.replicas {
			rep.proc.Stop(15 * time.Second)
		}
		if svc.lb != nil {
			svc.lb.close()
		}
	}
	if s.sink != nil {
		s.sink.close()
	}
	if s.node != nil {
		s.node.Stop()
	}
	if s.cp != nil {
		s.cp.Stop()
	}
}

// startTries is how often a replica is started before the test gives up on it.
const startTries = 5

// lastError is the message and error of the last error a program logged by time t.
func lastError(path string, t time.Time) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "no log"
	}
	found := "no error logged"
	for _, line := range strings.Split(string(raw), "\n") {
		var entry struct {
			Time  time.Time `json:"time"`
			Level string    `json:"level"`
			Msg   string    `json:"msg"`
			Error string    `json:"error"`
		}
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &entry) != nil || entry.Level != "ERROR" || entry.Time.After(t) {
			continue
		}
		found = entry.Msg + ": " + entry.Error
	}
	return found
}
