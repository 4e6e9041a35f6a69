package deploy_test

// The compose topology, run as plain processes: health checks, ports, shutdown, spans.

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
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

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	_ "github.com/flytekube/backend/gen/go/flyte/cache/v1"  // the descriptors of the RPCs runCompose calls
	_ "github.com/flytekube/backend/gen/go/flyte/events/v1" // the descriptors of the RPCs runCompose calls
	"github.com/flytekube/backend/internal/pgtest"
	"github.com/flytekube/backend/internal/ports"
	"github.com/flytekube/backend/internal/servicetest"
)

// runCompose runs what `docker compose --profile executor up` would, as processes on
// this machine: every service built here from the binary its Dockerfile builds, with
// compose's command, environment, mounted files and health check, in depends_on order;
// Postgres from pgtest, an OTLP collector for Jaeger and envtest's API server for the
// kind cluster stand in for the rest. All processes share this machine's network, so
// each listener moves to a free port on 127.0.0.1 (appended flags, or the copy of a
// --config file) and every URL to it (environment, config, health check) follows.
// Then each service must stop cleanly on SIGTERM and have sent its traces, named by
// OTEL_SERVICE_NAME, to where OTEL_EXPORTER_OTLP_ENDPOINT says.
func runCompose(t *testing.T, root string, c *composeProject, infos map[string]*composeInfo, bins map[string]*goBinary) {
	healthcheck := bins["./deploy/docker/healthcheck"]
	if healthcheck == nil {
		t.Fatal("no Dockerfile builds ./deploy/docker/healthcheck")
	}
	dir := t.TempDir()
	addrs := map[string]map[int]string{} // service → container port → address here
	var dbURL string
	collector := newOTLPCollector(t)
	for _, name := range slices.Sorted(maps.Keys(infos)) {
		info := infos[name]
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
			dbURL = pg.NewDatabase(t) // one database for all, as in compose
			u, _ := url.Parse(dbURL)
			addrs[name] = map[int]string{5432: u.Host}
		case "jaegertracing/all-in-one":
			addrs[name] = map[int]string{4318: collector.addr}
		default:
			t.Fatalf("service %s: no stand-in for %s", name, info.svc.Image)
		}
	}

	// remap turns a URL to a compose service into one to its stand-in.
	remap := func(raw string) (string, error) {
		u, err := url.Parse(raw)
		if err != nil || infos[u.Hostname()] == nil {
			return raw, err
		}
		if u.Scheme == "postgres" || u.Scheme == "postgresql" {
			return dbURL, nil
		}
		p, _ := strconv.Atoi(cmpOr(u.Port(), map[string]string{"http": "80", "https": "443"}[u.Scheme]))
		a := addrs[u.Hostname()][p]
		if a == "" {
			return "", fmt.Errorf("%s: nothing stands in for %s:%d", raw, u.Hostname(), p)
		}
		u.Host = a
		return u.String(), nil
	}

	type running struct {
		name string
		cmd  *exec.Cmd
		out  *servicetest.SyncBuffer
		done chan error
	}
	var started []*running
	defer func() {
		for _, r := range started {
			if r.cmd.ProcessState == nil {
				_ = r.cmd.Process.Kill()
				<-r.done
			}
			if t.Failed() {
				t.Logf("service %s output:\n%s", r.name, r.out.String())
			}
		}
	}()
	for _, name := range startOrder(c) {
		info := infos[name]
		if info.img == nil {
			continue
		}
		svc, bin := info.svc, info.bin
		where := "service " + name
		addrs[name] = map[int]string{}
		for p := range info.listens {
			addrs[name][p] = freeAddr(t)
		}

		// Mounted files: the repository's are used as they are (a --config file as a
		// copy with the new addresses); the user's kubeconfig is envtest's.
		files := map[string]string{} // container path → path here
		for target, m := range info.mounts {
			switch {
			case m.Type == "bind" && strings.HasPrefix(m.Source, "./"):
				files[target] = filepath.Join(root, filepath.FromSlash(m.Source))
			case m.Type == "bind" && svc.Environment["KUBECONFIG"] == target:
				files[target] = envtestKubeconfig(t, dir)
				applyCRDs(t, root)
			default:
				t.Fatalf("%s: nothing stands in for mount %s of %s", where, target, m.Source)
			}
		}
		args := slices.Concat(info.img.entrypoint[1:], svc.Command)
		for i, a := range args {
			for target, file := range files {
				if a == target {
					args[i] = file
				} else if flag, ok := strings.CutSuffix(a, "="+target); ok {
					args[i] = flag + "=" + file
				}
			}
		}
		for p, listener := range info.listens {
			if _, ok := bin.flags[listener]; ok {
				args = append(args, "--"+listener+"="+addrs[name][p])
			}
		}
		if info.config != "" {
			copied := rewriteConfig(t, info, addrs[name], remap, filepath.Join(dir, name+"-config.yaml"))
			for i, a := range args {
				if a == info.config {
					args[i] = copied
				} else if flag, ok := strings.CutSuffix(a, "="+info.config); ok {
					args[i] = flag + "=" + copied
				}
			}
		}
		env := []string{"HOME=" + dir, "TMPDIR=" + dir}
		for k, v := range svc.Environment {
			if file, ok := files[v]; ok {
				v = file
			} else if strings.Contains(v, "://") {
				var err error
				if v, err = remap(v); err != nil {
					t.Fatalf("%s env %s: %v", where, k, err)
				}
			}
			env = append(env, k+"="+v)
		}

		r := &running{name: name, out: &servicetest.SyncBuffer{}, done: make(chan error, 1)}
		r.cmd = exec.Command(bin.file, args...)
		r.cmd.Env, r.cmd.Stdout, r.cmd.Stderr = env, r.out, r.out
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		started = append(started, r)
		go func() { r.done <- r.cmd.Wait() }()
		t.Logf("%s: %s %s", where, filepath.Base(bin.file), strings.Join(args, " "))

		// Its health check, as compose runs it, until it passes or compose would give up.
		hc := svc.Healthcheck
		interval, _ := time.ParseDuration(hc.Interval)
		target, err := url.Parse(hc.Test[2])
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(target.Port())
		target.Host = addrs[name][p]
		healthy := false
		for range hc.Retries {
			out, err := exec.Command(healthcheck.file, target.String()).CombinedOutput()
			if err == nil {
				healthy = true
				break
			}
			select {
			case err := <-r.done:
				r.done <- err
				t.Fatalf("%s exited before it was healthy: %v", where, err)
			case <-time.After(interval):
			}
			if testing.Verbose() {
				t.Logf("%s: health check: %s", where, bytes.TrimSpace(out))
			}
		}
		if !healthy {
			t.Fatalf("%s: health check %q never passed", where, hc.Test)
		}
		// A traced call: every unary flyte.* RPC with an empty request, which the server
		// traces even when it rejects it.
		for p, listener := range info.listens {
			if listener == rpcListener {
				callUnaryRPCs(t, where, addrs[name][p])
			}
		}
		// Every published port answers: /metrics on metrics listeners, /healthz elsewhere.
		for _, mapping := range svc.Ports {
			p, _ := strconv.Atoi(portMapping.FindStringSubmatch(mapping)[3])
			pathname := "/healthz"
			if strings.Contains(strings.ToLower(info.listens[p]), "metrics") {
				pathname = "/metrics"
			}
			if out, err := exec.Command(healthcheck.file, "http://"+addrs[name][p]+pathname).CombinedOutput(); err != nil {
				t.Errorf("%s: published port %s: GET %s: %s", where, mapping, pathname, bytes.TrimSpace(out))
			}
		}
	}

	// Stop in reverse order, as compose does, within each service's grace period.
	for i := len(started) - 1; i >= 0; i-- {
		r := started[i]
		grace := 10 * time.Second
		if d, err := time.ParseDuration(c.Services[r.name].StopGracePeriod); err == nil {
			grace = d
		}
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("service %s did not stop cleanly on SIGTERM: %v", r.name, err)
			}
		case <-time.After(grace):
			t.Errorf("service %s did not stop within %s of SIGTERM", r.name, grace)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(infos)) {
		env := infos[name].svc.Environment
		if infos[name].img == nil || cmpOr(env["OTEL_EXPORTER_OTLP_ENDPOINT"], env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]) == "" {
			continue
		}
		if !slices.Contains(slices.Collect(maps.Values(infos[name].listens)), rpcListener) {
			continue // no RPC to trace
		}
		want := cmpOr(env["OTEL_SERVICE_NAME"], infos[name].bin.name)
		if !collector.received(want) {
			t.Errorf("service %s: no spans of service.name %q reached its OTLP endpoint (got %v)", name, want, collector.services())
		}
	}
}

// callUnaryRPCs calls, with an empty JSON request, every unary method of the flyte.*
// services the test binary knows, and requires the server at addr to serve at least one.
func callUnaryRPCs(t *testing.T, where, addr string) {
	t.Helper()
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
				resp, err := http.Post("http://"+addr+"/"+string(sd.FullName())+"/"+string(md.Name()), "application/json", strings.NewReader("{}"))
				if err != nil {
					t.Errorf("%s: calling %s: %v", where, md.FullName(), err)
					continue
				}
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound {
					served++
				}
			}
		}
		return true
	})
	if served == 0 {
		t.Errorf("%s serves none of the flyte.* RPCs this test knows (import its generated package)", where)
	}
}

// rewriteConfig writes a copy of a service's --config file with its listeners on the
// given addresses and its URLs remapped.
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
	_, urls, err := configFiles[info.bin.name](info.config)
	if err != nil {
		t.Fatal(err)
	}
	for setting, u := range urls {
		if m[setting], err = remap(u); err != nil {
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

// envtestKubeconfig writes a kubeconfig for this package's API server.
func envtestKubeconfig(t *testing.T, dir string) string {
	t.Helper()
	cfg := env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	file := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, file); err != nil {
		t.Fatal(err)
	}
	return file
}

// applyCRDs installs deploy/crd, as the README has users do before starting the executor.
func applyCRDs(t *testing.T, root string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	files, err := filepath.Glob(filepath.Join(root, "deploy", "crd", "*_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in deploy/crd: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("compose-test"), client.ForceOwnership); err != nil {
			t.Fatalf("applying %s: %v", f, err)
		}
		waitEstablished(ctx, t, u.GetName())
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
