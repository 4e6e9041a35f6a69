package deploy_test

// The compose topology, run as plain processes: health checks, ports, shutdown, spans.

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/events/cloudevents"
	_ "github.com/flytekube/backend/gen/go/flyte/cache/v1"  // the descriptors of the RPCs runCompose calls
	_ "github.com/flytekube/backend/gen/go/flyte/events/v1" // the descriptors of the RPCs runCompose calls
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/servicetest"
)

// runCompose runs what `docker compose --profile executor up` would, as processes on
// this machine: every service built here from the binary its Dockerfile builds, with
// compose's command, environment, mounted files, volumes (a directory each) and health
// check, in depends_on order; Postgres from pgtest, an OTLP collector for Jaeger and
// envtest's API server for the kind cluster stand in for the rest. A service run once
// (the credentials) runs again, as every `up` does, and must keep what it made. All
// processes share this machine's network, so each listener moves to a free port on
// 127.0.0.1 (appended flags, or the copy of a --config file) and every URL to it
// (environment, config, health check) follows. Then each service must stop cleanly on
// SIGTERM and have sent its traces, named by OTEL_SERVICE_NAME, to where
// OTEL_EXPORTER_OTLP_ENDPOINT says.
func runCompose(t *testing.T, root string, c *types.Project, infos map[string]*composeInfo, bins map[string]*goBinary, vols map[string]string) {
	r := &composeRun{t: t, root: root, c: c, infos: infos, vols: vols, dir: t.TempDir(),
		healthcheck: bins["./deploy/docker/healthcheck"], addrs: map[string]map[int]string{}, collector: newOTLPCollector(t)}
	if r.healthcheck == nil {
		t.Fatal("no Dockerfile builds ./deploy/docker/healthcheck")
	}
	defer r.kill()
	r.standIns()
	for _, name := range startOrder(t, c) {
		info := infos[name]
		switch {
		case info.img == nil && info.oneShot:
			r.runUpstreamOneShot(info)
		case info.img == nil: // stood in for, by standIns
		case info.oneShot:
			// Compose runs it again on every `up`: what it made must be kept.
			before := volumeFiles(t, info)
			runOneShot(t, info)
			if after := volumeFiles(t, info); !maps.Equal(before, after) {
				t.Errorf("service %s: run again, it changed its volumes' files (%d before, %d after): what it makes must be kept", name, len(before), len(after))
			}
		default:
			p := r.start(info)
			caFile := r.waitHealthy(info, p)
			// A traced call: every unary flyte.* RPC with an empty request, which the
			// server traces even when it rejects it; with tokens of each kind, and over
			// TLS when the port serves it.
			for port, listener := range info.listens {
				if listener == rpcListener {
					callUnaryRPCs(t, "service "+name, info, r.addrs[name][port], caFile, info.servesTLS(port))
					r.checkCloudEvents(info, r.addrs[name][port], caFile)
				}
			}
			r.checkPublished(info, caFile)
		}
	}
	r.stop()
	r.checkSpans()
}

// composeRun is what runCompose has started and where.
type composeRun struct {
	t           *testing.T
	root        string
	c           *types.Project
	infos       map[string]*composeInfo
	vols        map[string]string
	dir         string
	healthcheck *goBinary
	addrs       map[string]map[int]string // service → container port → address here
	dbURL       string
	collector   *otlpCollector
	started     []*process
}

// process is a service's binary running.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *servicetest.SyncBuffer
	done chan error
}

// standIns starts what stands in for the images this repository does not build.
func (r *composeRun) standIns() {
	t := r.t
	for _, name := range slices.Sorted(maps.Keys(r.infos)) {
		info := r.infos[name]
		if info.img != nil {
			continue
		}
		repoName, _, _ := strings.Cut(info.svc.Image, ":")
		switch repoName {
		case "postgres":
			pg, err := pgtest.Start()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pg.Stop() })
			r.dbURL = pg.NewDatabase(t) // one database for all, as in compose
			u, _ := url.Parse(r.dbURL)
			r.addrs[name] = map[int]string{5432: u.Host}
		case "jaegertracing/all-in-one":
			r.addrs[name] = map[int]string{4318: r.collector.addr}
		case "nats":
			r.addrs[name] = r.standInNATS(info)
		case "natsio/nats-box": // a one-shot: run in start order (runUpstreamOneShot)
		default:
			t.Fatalf("service %s: no stand-in for %s", name, info.svc.Image)
		}
	}
}

// remap turns a URL to a compose service into one to where it runs here.
func (r *composeRun) remap(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || r.infos[u.Hostname()] == nil {
		return raw, err
	}
	if u.Scheme == "postgres" || u.Scheme == "postgresql" {
		return r.dbURL, nil
	}
	p, _ := strconv.Atoi(cmp.Or(u.Port(), schemeListeners[u.Scheme].port))
	a := r.addrs[u.Hostname()][p]
	if a == "" {
		return "", fmt.Errorf("%s: nothing stands in for %s:%d", raw, u.Hostname(), p)
	}
	u.Host = a
	return u.String(), nil
}

// start starts a service with compose's command and environment, its listeners on free
// ports, and its mounts where they are here: the repository's files and the volumes'
// directories where they are (a --config file as a copy with the new addresses), the
// user's kubeconfig envtest's.
func (r *composeRun) start(info *composeInfo) *process {
	t, name, svc := r.t, info.name, info.svc
	where := "service " + name
	r.addrs[name] = map[int]string{}
	for p := range info.listens {
		r.addrs[name][p] = freeAddr(t)
	}
	files := map[string]string{} // container path → path here, for the user's files
	for target, m := range info.mounts {
		switch {
		case m.Type == types.VolumeTypeBind && inRepo(r.root, m.Source), m.Type == types.VolumeTypeVolume && r.vols[m.Source] != "":
		case m.Type == types.VolumeTypeBind && info.env["KUBECONFIG"] == target:
			files[target] = envtestKubeconfig(t, r.dir)
			installCRD(t, r.root)
		default:
			t.Fatalf("%s: nothing stands in for mount %s of %s", where, target, m.Source)
		}
	}
	if file := info.args["cloudevents-config"]; file != "" {
		files[file] = rewriteSinks(t, info, r.remap, filepath.Join(r.dir, name+"-cloudevents.yaml"))
	}
	args := slices.Concat(info.img.entrypoint[1:], svc.Command)
	for i, a := range args {
		args[i] = info.here(a, files)
	}
	// The sinks are called while the test runs: they follow the stand-ins.
	remap := func(raw string) string {
		u, err := r.remap(raw)
		if err != nil {
			t.Fatalf("%s --cloudevents-sink: %v", where, err)
		}
		return u
	}
	for i := range args {
		for _, flag := range []string{"-cloudevents-sink", "--cloudevents-sink"} {
			if v, ok := strings.CutPrefix(args[i], flag+"="); ok {
				args[i] = flag + "=" + remap(v)
			} else if args[i] == flag && i+1 < len(args) {
				args[i+1] = remap(args[i+1])
			}
		}
	}
	for p, listener := range info.listens {
		if _, ok := info.bin.flags[listener]; ok {
			args = append(args, "--"+listener+"="+r.addrs[name][p])
		}
	}
	if info.config != "" {
		copied := rewriteConfig(t, info, r.addrs[name], r.remap, filepath.Join(r.dir, name+"-config.yaml"))
		for i, a := range args {
			if a == info.config {
				args[i] = copied
			} else if flag, ok := strings.CutSuffix(a, "="+info.config); ok {
				args[i] = flag + "=" + copied
			}
		}
	}
	env := []string{"HOME=" + r.dir, "TMPDIR=" + r.dir}
	for k, v := range info.env {
		if strings.Contains(v, "://") {
			var err error
			if v, err = r.remap(v); err != nil {
				t.Fatalf("%s env %s: %v", where, k, err)
			}
		} else {
			v = info.here(v, files)
		}
		env = append(env, k+"="+v)
	}
	p := &process{name: name, out: &servicetest.SyncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(info.bin.file, args...)
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = env, p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.started = append(r.started, p)
	go func() { p.done <- p.cmd.Wait() }()
	t.Logf("%s: %s %s", where, filepath.Base(info.bin.file), strings.Join(args, " "))
	return p
}

// waitHealthy runs the service's health check as compose does, until it passes or
// compose would give up, and returns the CA its TLS port is checked with ("" for none).
func (r *composeRun) waitHealthy(info *composeInfo, p *process) (caFile string) {
	t, where, hc := r.t, "service "+info.name, info.svc.HealthCheck
	hcFlags, rawTarget, err := healthcheckArgs(hc.Test, r.healthcheck)
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(rawTarget)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(target.Port())
	target.Host = r.addrs[info.name][port]
	var args []string
	for _, a := range hc.Test[2 : len(hc.Test)-1] {
		args = append(args, info.here(a, nil))
	}
	args = append(args, target.String())
	if hcFlags["cacert"] != "" {
		if caFile, err = info.hostPath(hcFlags["cacert"]); err != nil {
			t.Fatal(err)
		}
	}
	for range *hc.Retries {
		out, err := exec.Command(r.healthcheck.file, args...).CombinedOutput()
		if err == nil {
			return caFile
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s exited before it was healthy: %v", where, err)
		case <-time.After(time.Duration(*hc.Interval)):
		}
		if testing.Verbose() {
			t.Logf("%s: health check: %s", where, bytes.TrimSpace(out))
		}
	}
	t.Fatalf("%s: health check %q never passed", where, hc.Test)
	return ""
}

// checkPublished requires every published port to answer: /metrics on metrics
// listeners, the page on the console's, /healthz elsewhere.
func (r *composeRun) checkPublished(info *composeInfo, caFile string) {
	for _, mapping := range info.svc.Ports {
		p := int(mapping.Target)
		pathname := "/healthz"
		switch listener := info.listens[p]; {
		case strings.Contains(strings.ToLower(listener), "metrics"):
			pathname = "/metrics"
		case listener == consoleListener:
			pathname = "/console/"
		}
		check := []string{"http://" + r.addrs[info.name][p] + pathname}
		if info.servesTLS(p) {
			check = []string{"-cacert=" + caFile, "https://" + r.addrs[info.name][p] + pathname}
		}
		if out, err := exec.Command(r.healthcheck.file, check...).CombinedOutput(); err != nil {
			r.t.Errorf("service %s: published port %s:%d: GET %s: %s", info.name, mapping.Published, mapping.Target, pathname, bytes.TrimSpace(out))
		}
	}
}

// stop stops the services in reverse order, as compose does, each within its grace
// period, and requires each to exit cleanly.
func (r *composeRun) stop() {
	for i := len(r.started) - 1; i >= 0; i-- {
		p := r.started[i]
		grace := 10 * time.Second
		if d := r.c.Services[p.name].StopGracePeriod; d != nil {
			grace = time.Duration(*d)
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			p.done <- err
			if err != nil {
				r.t.Errorf("service %s did not stop cleanly on SIGTERM: %v", p.name, err)
			}
		case <-time.After(grace):
			r.t.Errorf("service %s did not stop within %s of SIGTERM", p.name, grace)
		}
	}
}

// kill ends what is still running, and shows what the services said when the test failed.
func (r *composeRun) kill() {
	for _, p := range r.started {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if r.t.Failed() {
			r.t.Logf("service %s output:\n%s", p.name, p.out.String())
		}
	}
}

// checkSpans requires every service that serves RPCs and exports traces to have sent
// spans named by its OTEL_SERVICE_NAME.
func (r *composeRun) checkSpans() {
	for _, name := range slices.Sorted(maps.Keys(r.infos)) {
		info := r.infos[name]
		if info.img == nil || cmp.Or(info.env["OTEL_EXPORTER_OTLP_ENDPOINT"], info.env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]) == "" {
			continue
		}
		if !slices.Contains(slices.Collect(maps.Values(info.listens)), rpcListener) {
			continue // no RPC to trace
		}
		want := cmp.Or(info.env["OTEL_SERVICE_NAME"], info.bin.name)
		if !r.collector.received(want) {
			r.t.Errorf("service %s: no spans of service.name %q reached its OTLP endpoint (got %v)", name, want, r.collector.services())
		}
	}
}

// callUnaryRPCs calls, with an empty JSON request, every unary method of the flyte.*
// services the test binary knows, and requires the server at addr to serve at least one
// to the executors' token of its token file, and to refuse each without a token as
// Unauthenticated; on a TLS port, cleartext must be refused. (What a viewer may do is
// for the services' own tests: an empty request fails validation, which comes first.)
func callUnaryRPCs(t *testing.T, where string, info *composeInfo, addr, caFile string, tlsOn bool) {
	t.Helper()
	client, err := rpcclient.New(rpcclient.Options{CAFile: caFile, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr
	if tlsOn {
		base = "https://" + addr
		if resp, err := servicetest.H2CClient().Post("http://"+addr+"/grpc.health.v1.Health/Check", "application/json", strings.NewReader("{}")); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode < 400 {
				t.Errorf("%s: its TLS port answered cleartext HTTP/2 with %s", where, resp.Status)
			}
		}
	}
	var tokens map[string]string
	if info.args["auth-mode"] == "token-file" {
		if tokens, err = tokensByGroup(info, info.args["auth-token-file"]); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
	}
	call := func(path, token string) (int, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader("{}"))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	served := 0
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "flyte.") {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				if md.IsStreamingClient() || md.IsStreamingServer() {
					continue
				}
				path := "/" + string(sd.FullName()) + "/" + string(md.Name())
				code, err := call(path, tokens[auth.Executors])
				if err != nil {
					t.Errorf("%s: calling %s: %v", where, md.FullName(), err)
					continue
				}
				if code == http.StatusNotFound {
					continue
				}
				served++
				if code == http.StatusUnauthorized || code == http.StatusForbidden {
					t.Errorf("%s: %s refused the executors' token: %d", where, md.FullName(), code)
				}
				if tokens == nil {
					continue
				}
				if code, err := call(path, ""); err != nil || code != http.StatusUnauthorized {
					t.Errorf("%s: %s without a token: %d %v, want 401", where, md.FullName(), code, err)
				}
			}
		}
		return true
	})
	if served == 0 {
		t.Errorf("%s serves none of the flyte.* RPCs this test knows (import its generated package)", where)
	}
}

// runOneShot runs a service that others wait for to complete, as compose does before
// starting them, and requires it to succeed.
func runOneShot(t *testing.T, info *composeInfo) {
	t.Helper()
	args := slices.Concat(info.img.entrypoint[1:], info.svc.Command)
	for i, a := range args {
		args[i] = info.here(a, nil)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, info.bin.file, args...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	for k, v := range info.env {
		cmd.Env = append(cmd.Env, k+"="+info.here(v, nil))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("service %s (run once, before the services that wait for it): %s %s: %v\n%s", info.name, filepath.Base(info.bin.file), strings.Join(args, " "), err, out)
	}
	t.Logf("service %s: %s %s: %s", info.name, filepath.Base(info.bin.file), strings.Join(args, " "), bytes.TrimSpace(out))
}

// volumeFiles reads every file of the volumes a service mounts writable.
func volumeFiles(t *testing.T, info *composeInfo) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range info.mounts {
		if m.Type != types.VolumeTypeVolume || m.ReadOnly {
			continue
		}
		err := filepath.WalkDir(info.vols[m.Source], func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			out[path] = string(data)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// here rewrites an argument or environment value naming a path in the service's
// container, alone or as a flag's value, to where that path is on this machine: files
// stands in for single files mounted from outside the repository.
func (info *composeInfo) here(a string, files map[string]string) string {
	prefix, path := "", a
	if i := strings.Index(a, "=/"); i >= 0 {
		prefix, path = a[:i+1], a[i+1:]
	}
	if !strings.HasPrefix(path, "/") {
		return a
	}
	if f, ok := files[path]; ok {
		return prefix + f
	}
	if p, err := info.hostPath(path); err == nil {
		return prefix + p
	}
	return a
}

// rewriteConfig writes a copy of a service's --config file with its listeners on the
// given addresses, its URLs remapped and the files it reads where they are here.
func rewriteConfig(t *testing.T, info *composeInfo, addrs map[int]string, remap func(string) (string, error), file string) string {
	t.Helper()
	data, err := os.ReadFile(info.config)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for p, setting := range info.listens {
		if _, isFlag := info.bin.flags[setting]; !isFlag {
			m[setting] = addrs[p]
		}
	}
	for setting, u := range info.cfg.urls {
		if m[setting], err = remap(u); err != nil {
			t.Fatalf("service %s --config %s: %v", info.name, setting, err)
		}
	}
	for setting, path := range info.cfg.files {
		if m[setting], err = info.hostPath(path); err != nil {
			t.Fatalf("service %s --config %s: %v", info.name, setting, err)
		}
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// rewriteSinks writes a copy of the events service's --cloudevents-config whose sinks
// call the stand-ins of the services they name and read their files where they are here.
func rewriteSinks(t *testing.T, info *composeInfo, remap func(string) (string, error), file string) string {
	t.Helper()
	where := "service " + info.name + " --cloudevents-config"
	at := func(scheme string, hostPorts []string) []string {
		out := make([]string, len(hostPorts))
		for i, hp := range hostPorts {
			u, err := remap(scheme + "://" + hp)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			out[i] = strings.TrimPrefix(u, scheme+"://")
		}
		return out
	}
	here := func(path string) string {
		if path == "" {
			return ""
		}
		f, err := info.hostPath(path)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		return f
	}
	var out cloudevents.File
	for _, s := range info.sinks {
		switch {
		case s.HTTP != nil:
			h := *s.HTTP
			u, err := remap(h.URL)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			h.URL, h.CAFile, h.TokenFile = u, here(h.CAFile), here(h.TokenFile)
			s.HTTP = &h
		case s.NATS != nil:
			n := *s.NATS
			n.Servers, n.CAFile, n.TokenFile = at("nats", n.Servers), here(n.CAFile), here(n.TokenFile)
			s.NATS = &n
		case s.Kafka != nil:
			k := *s.Kafka
			k.Brokers, k.CAFile = at("kafka", k.Brokers), here(k.CAFile)
			s.Kafka = &k
		}
		out.Sinks = append(out.Sinks, s)
	}
	data, err := yaml.Marshal(out)
	if err == nil {
		err = os.WriteFile(file, data, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	return file
}

// envtestKubeconfig writes a kubeconfig of an administrator of this package's API
// server.
func envtestKubeconfig(t *testing.T, dir string) string {
	t.Helper()
	kubeconfig, err := env.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(file, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// installCRD installs the CRD of deploy/crd, as the README has users do before starting
// the executor, and waits for the API server to serve it.
func installCRD(t *testing.T, root string) {
	t.Helper()
	if err := kubetest.ApplyCRD(context.Background(), env.Client, filepath.Join(root, "deploy", "crd", "flyte.org_taskactions.yaml"), "compose"); err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := ports.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p[0])
}

// otlpCollector stands in for Jaeger's OTLP/HTTP receiver and notes the service.name of
// every resource whose spans it receives.
type otlpCollector struct {
	addr string
	mu   sync.Mutex
	seen map[string]bool
}

func newOTLPCollector(t *testing.T) *otlpCollector {
	t.Helper()
	c := &otlpCollector{seen: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		data, err := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(data, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" && len(rs.GetScopeSpans()) > 0 {
					c.seen[kv.GetValue().GetStringValue()] = true
				}
			}
		}
		c.mu.Unlock()
		resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c.addr = srv.Listener.Addr().String()
	return c
}

func (c *otlpCollector) received(service string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[service]
}

func (c *otlpCollector) services() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.seen))
}
