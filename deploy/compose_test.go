package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/executor/config"
	_ "github.com/flytekube/backend/gen/go/flyte/cache/v1"  // the descriptors of the RPCs runCompose calls
	_ "github.com/flytekube/backend/gen/go/flyte/events/v1" // the descriptors of the RPCs runCompose calls
	"github.com/flytekube/backend/internal/repo"
)

// composeProject is the part of the compose specification docker-compose.yaml uses.
// Fields are decoded strictly: a key the test does not know fails it, so that nothing
// added to the file goes unchecked.
type composeProject struct {
	Name     string                     `json:"name"`
	Services map[string]*composeService `json:"services"`
	Networks map[string]*composeNetwork `json:"networks"`
	Volumes  map[string]*struct{}       `json:"volumes"`
}

type composeService struct {
	Profiles        []string                    `json:"profiles"`
	Image           string                      `json:"image"`
	Build           *composeBuild               `json:"build"`
	Command         []string                    `json:"command"`
	Environment     map[string]string           `json:"environment"`
	Ports           []string                    `json:"ports"`
	Volumes         []composeMount              `json:"volumes"`
	Tmpfs           []string                    `json:"tmpfs"`
	Networks        []string                    `json:"networks"`
	Healthcheck     *composeHealthcheck         `json:"healthcheck"`
	DependsOn       map[string]composeDependsOn `json:"depends_on"`
	ReadOnly        bool                        `json:"read_only"`
	CapDrop         []string                    `json:"cap_drop"`
	SecurityOpt     []string                    `json:"security_opt"`
	StopGracePeriod string                      `json:"stop_grace_period"`
	User            string                      `json:"user"`
}

type composeBuild struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
}

type composeNetwork struct {
	Name     string `json:"name"`
	External bool   `json:"external"`
}

type composeHealthcheck struct {
	Test     []string `json:"test"`
	Interval string   `json:"interval"`
	Timeout  string   `json:"timeout"`
	Retries  int      `json:"retries"`
	Disable  bool     `json:"disable"`
}

type composeDependsOn struct {
	Condition string `json:"condition"`
}

// composeMount is a volume in either syntax: "source:target[:ro]" or the long form.
type composeMount struct {
	Type     string `json:"type"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only"`
	Bind     *struct {
		CreateHostPath *bool `json:"create_host_path"`
	} `json:"bind"`
}

func (m *composeMount) UnmarshalJSON(data []byte) error {
	var short string
	if err := json.Unmarshal(data, &short); err == nil {
		parts := strings.Split(short, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("volume %q: want source:target[:ro]", short)
		}
		m.Source, m.Target = parts[0], parts[1]
		m.ReadOnly = len(parts) == 3 && parts[2] == "ro"
		m.Type = "volume"
		if strings.ContainsAny(m.Source[:1], "./~") {
			m.Type = "bind"
		}
		return nil
	}
	type long composeMount
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode((*long)(m))
}

// upstreamImages are the images this repository does not build, by repository, with
// the ports they listen on (which the test cannot ask them without Docker): the names
// are what a URL to that port must be for.
var upstreamImages = map[string]map[int]string{
	"postgres":                 {5432: "postgres"},
	"jaegertracing/all-in-one": {16686: "ui", 4317: "otlp-grpc", 4318: "otlp-http", 14269: "admin"},
}

// rpcListener is the flag naming the RPC address of the services; URLs to them over
// http must reach it.
const rpcListener = "listen"

// configFiles read a binary's --config file as the binary does (defaults for ""), and
// return what it listens on (port → setting) and the URLs it calls (setting → URL).
var configFiles = map[string]func(file string) (map[int]string, map[string]string, error){
	"executor": func(file string) (map[int]string, map[string]string, error) {
		cfg, err := config.Load(file)
		if err != nil {
			return nil, nil, err
		}
		listens := map[int]string{}
		for name, addr := range map[string]string{
			"healthProbeBindAddress": cfg.HealthProbeBindAddress,
			"metricsBindAddress":     cfg.MetricsBindAddress,
		} {
			if addr != "0" && addr != "" {
				p, err := portOf(addr)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: %w", name, err)
				}
				listens[p] = name
			}
		}
		urls := map[string]string{}
		for name, u := range map[string]string{"eventsServiceURL": cfg.EventsServiceURL, "cacheServiceURL": cfg.CacheServiceURL} {
			if u != "" {
				urls[name] = u
			}
		}
		return listens, urls, nil
	},
}

// composeInfo is what the checks need to know of a service, worked out once.
type composeInfo struct {
	name    string
	svc     *composeService
	img     *image    // nil for upstream images
	bin     *goBinary // nil for upstream images
	args    map[string]string
	listens map[int]string          // container port → listener name
	mounts  map[string]composeMount // by target
	config  string                  // host path of the --config file, if any
	urls    []urlUse
	broken  bool // its command or --config is wrong (reported): its ports are unknown
}

// urlUse is a URL a service calls: where it is set, and which listener it must reach
// ("" for any).
type urlUse struct{ where, raw, want string }

// TestCompose checks docker-compose.yaml and the Dockerfiles it builds against the code,
// since no Docker engine runs where the tests run: each binary is built as its Dockerfile
// builds it and asked its flags, and the flags, environment, URLs, ports, mounts, health
// checks and start order of compose are held to what the binaries read and serve. Then
// it runs what compose would run, as plain processes (runCompose).
func TestCompose(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	c := loadCompose(t, filepath.Join(root, "docker-compose.yaml"))
	images := map[string]*image{} // by service
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		if b := c.Services[name].Build; b != nil {
			if b.Context != "." {
				t.Errorf("service %s builds from context %q: the Dockerfiles expect the repository root", name, b.Context)
			}
			images[name] = loadImage(t, root, b.Dockerfile)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	bins := buildBinaries(t, root, images)
	infos := composeInfos(t, root, c, images, bins)

	t.Run("dockerfiles", func(t *testing.T) { checkDockerfiles(t, root, images, bins) })
	t.Run("dockerignore", func(t *testing.T) { checkDockerignore(t, root, images) })
	t.Run("services", func(t *testing.T) { checkComposeServices(t, root, c, infos) })
	t.Run("depends_on", func(t *testing.T) { checkDependsOn(t, c, infos) })
	if t.Failed() {
		return // running what is known to be wrong would only add noise
	}
	t.Run("run", func(t *testing.T) { runCompose(t, root, c, infos, bins) })
}

// loadCompose reads the compose file as compose would: YAML, then ${VAR:-default}
// interpolation (with no variables set, so the defaults apply) of every string value.
func loadCompose(t *testing.T, file string) *composeProject {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var generic any
	if err := json.Unmarshal(j, &generic); err != nil {
		t.Fatal(err)
	}
	generic, err = interpolate(generic)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	j, err = json.Marshal(generic)
	if err != nil {
		t.Fatal(err)
	}
	var c composeProject
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v (teach this test the new field, or it goes unchecked)", file, err)
	}
	if len(c.Services) == 0 {
		t.Fatalf("%s has no services", file)
	}
	return &c
}

var variable = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^${}]*))?\}|\$\$`)

func interpolate(v any) (any, error) {
	switch v := v.(type) {
	case string:
		out := variable.ReplaceAllStringFunc(v, func(m string) string {
			if m == "$$" {
				return "\x00"
			}
			return variable.FindStringSubmatch(m)[2] // unset: the default, or ""
		})
		if strings.Contains(out, "$") {
			return nil, fmt.Errorf("%q: only ${VAR}, ${VAR:-default} and $$ are understood here", v)
		}
		return strings.ReplaceAll(out, "\x00", "$"), nil
	case map[string]any:
		for k, e := range v {
			var err error
			if v[k], err = interpolate(e); err != nil {
				return nil, err
			}
		}
	case []any:
		for i, e := range v {
			var err error
			if v[i], err = interpolate(e); err != nil {
				return nil, err
			}
		}
	}
	return v, nil
}

// ---------------------------------------------------------------------------------------
// Dockerfiles

var goVersionLine = regexp.MustCompile(`(?m)^go (\d+\.\d+)`)

var addrDefault = regexp.MustCompile(`^[A-Za-z0-9.\-\[\]]*:\d+$`)

var (
	helpFlagLine = regexp.MustCompile(`^  -(\S+)(?: (\S+))?(?:\t(.*))?$`)
	helpDefault  = regexp.MustCompile(`\(default (.*)\)$`)
)

// composeInfos works out, for every service, its flags, listeners, mounts and the URLs
// it calls. Errors here are about the file, not the services.
func composeInfos(t *testing.T, root string, c *composeProject, images map[string]*image, bins map[string]*goBinary) map[string]*composeInfo {
	t.Helper()
	infos := map[string]*composeInfo{}
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		svc := c.Services[name]
		info := &composeInfo{name: name, svc: svc, img: images[name], mounts: map[string]composeMount{}}
		infos[name] = info
		for _, m := range svc.Volumes {
			if _, dup := info.mounts[m.Target]; dup {
				t.Errorf("service %s mounts two volumes at %s", name, m.Target)
			}
			info.mounts[m.Target] = m
		}
		if info.img == nil {
			repoName, _, _ := strings.Cut(svc.Image, ":")
			info.listens = upstreamImages[repoName]
			if info.listens == nil {
				t.Errorf("service %s: image %s is neither built here nor known to this test (upstreamImages)", name, svc.Image)
			}
			for k, v := range svc.Environment {
				if strings.Contains(v, "://") {
					info.urls = append(info.urls, urlUse{where: "env " + k, raw: v})
				}
			}
			continue
		}
		if len(info.img.entrypoint) == 0 {
			continue // reported with the Dockerfiles
		}
		info.bin = bins[info.img.files[info.img.entrypoint[0]]]
		if info.bin == nil || info.bin.flags == nil {
			continue // reported with the Dockerfiles
		}
		var err error
		if info.args, err = parseArgs(append(info.img.entrypoint[1:], svc.Command...), info.bin.flags); err != nil {
			t.Errorf("service %s: command %q: %v", name, svc.Command, err)
			info.broken = true
			continue
		}
		if file, ok := info.args["config"]; ok {
			m, ok := info.mounts[file]
			switch {
			case !ok:
				t.Errorf("service %s: --config %s is not mounted", name, file)
			case m.Type != "bind" || !strings.HasPrefix(m.Source, "./"):
				t.Errorf("service %s: --config %s comes from %s, not a file of this repository", name, file, m.Source)
			default:
				info.config = filepath.Join(root, filepath.FromSlash(m.Source))
				if !m.ReadOnly {
					t.Errorf("service %s: --config %s is mounted writable", name, file)
				}
				if configFiles[info.bin.name] == nil {
					t.Errorf("service %s: teach this test to read %s's --config", name, info.bin.name)
				} else if _, _, err := configFiles[info.bin.name](info.config); err != nil {
					t.Errorf("service %s: %s would not start with %s: %v", name, info.bin.name, m.Source, err)
					info.broken = true
					continue
				}
			}
		}
		if info.listens, err = info.bin.listeners(info.args, info.config); err != nil {
			t.Errorf("service %s: %v", name, err)
			info.broken = true
		}
		for k, v := range svc.Environment {
			if !strings.Contains(v, "://") {
				continue
			}
			want := ""
			switch k {
			case "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
				want = otlpListener(svc.Environment)
			}
			info.urls = append(info.urls, urlUse{where: "env " + k, raw: v, want: want})
		}
		if load := configFiles[info.bin.name]; load != nil && info.config != "" {
			_, urls, _ := load(info.config)
			for k, v := range urls {
				info.urls = append(info.urls, urlUse{where: "--config " + k, raw: v, want: rpcListener})
			}
		}
		slices.SortFunc(info.urls, func(a, b urlUse) int { return strings.Compare(a.where, b.where) })
	}
	return infos
}

// otlpListener is the Jaeger port OTLP traces go to with the protocol the environment
// selects; services/telemetry's default protocol is http/protobuf.
func otlpListener(env map[string]string) string {
	protocol := cmpOr(env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"], env["OTEL_EXPORTER_OTLP_PROTOCOL"], "http/protobuf")
	if protocol == "grpc" {
		return "otlp-grpc"
	}
	return "otlp-http"
}

func cmpOr(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

var portMapping = regexp.MustCompile(`^(\d+\.\d+\.\d+\.\d+):(\d+):(\d+)$`)

// checkComposeServices checks each service against its image and binary.
func checkComposeServices(t *testing.T, root string, c *composeProject, infos map[string]*composeInfo) {
	kustomizeImages := map[string]string{}
	for _, u := range render(t, filepath.Join("deploy", "kustomize", "base")) {
		if u.GetKind() == "Deployment" {
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			if len(containers) > 0 {
				img, _ := containers[0].(map[string]any)["image"].(string)
				kustomizeImages[u.GetName()] = img
			}
		}
	}
	hostPorts := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(infos)) {
		info := infos[name]
		svc := info.svc
		where := "service " + name
		if _, tag, ok := strings.Cut(svc.Image, ":"); !ok || tag == "" || (info.img == nil && tag == "latest") {
			t.Errorf("%s: image %q is not pinned to a tag", where, svc.Image)
		}
		for _, n := range svc.Networks {
			if _, ok := c.Networks[n]; !ok && n != "default" {
				t.Errorf("%s: network %s is not declared", where, n)
			}
		}
		for target, m := range info.mounts {
			switch {
			case m.Type == "volume":
				if _, ok := c.Volumes[m.Source]; !ok {
					t.Errorf("%s: volume %s is not declared", where, m.Source)
				}
			case m.Type == "bind" && strings.HasPrefix(m.Source, "./"):
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(m.Source))); err != nil {
					t.Errorf("%s: mount %s: %v", where, target, err)
				}
			case m.Type == "bind":
				// The user's own file (a kubeconfig): it must exist, not be created empty.
				if m.Bind == nil || m.Bind.CreateHostPath == nil || *m.Bind.CreateHostPath {
					t.Errorf("%s: mount %s of %s would create a directory when the file is missing: set bind.create_host_path: false", where, target, m.Source)
				}
			default:
				t.Errorf("%s: mount %s: type %q", where, target, m.Type)
			}
		}
		for _, p := range svc.Ports {
			if info.broken {
				break
			}
			m := portMapping.FindStringSubmatch(p)
			if m == nil || m[1] != "127.0.0.1" {
				t.Errorf("%s: port %q is not published on 127.0.0.1 only (want 127.0.0.1:HOST:CONTAINER)", where, p)
				continue
			}
			if other, dup := hostPorts[m[2]]; dup {
				t.Errorf("%s: host port %s is %s's too", where, m[2], other)
			}
			hostPorts[m[2]] = name
			if cp, _ := strconv.Atoi(m[3]); info.listens[cp] == "" {
				t.Errorf("%s: port %q: nothing in the container listens on %d (it listens on %v)", where, p, cp, info.listens)
			}
		}
		for _, u := range info.urls {
			checkComposeURL(t, c, infos, info, u)
		}
		if hc := svc.Healthcheck; hc != nil && hc.Disable {
			t.Errorf("%s: health check disabled", where)
		}
		if info.img == nil {
			continue
		}

		// A service built here.
		if want := kustomizeImages[info.img.binary]; svc.Image != want {
			t.Errorf("%s: image %s, the kustomize base runs %q", where, svc.Image, want)
		}
		if info.bin == nil || info.bin.flags == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(svc.Environment)) {
			v := svc.Environment[k]
			if !info.bin.reads(k) {
				t.Errorf("%s: env %s: nothing %s is built from reads it", where, k, info.bin.pkg)
			}
			if strings.HasPrefix(v, "/") {
				if _, ok := info.mounts[v]; !ok {
					t.Errorf("%s: env %s=%s: nothing is mounted there", where, k, v)
				}
			}
		}
		if svc.User != "" {
			t.Errorf("%s: user %q overrides the image's non-root user", where, svc.User)
		}
		if !svc.ReadOnly || !slices.Equal(svc.CapDrop, []string{"ALL"}) || !slices.Contains(svc.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("%s: not hardened as in the cluster: want read_only, cap_drop [ALL], security_opt no-new-privileges:true", where)
		}
		hc := svc.Healthcheck
		if hc == nil {
			t.Errorf("%s: no health check", where)
			continue
		}
		if len(hc.Test) != 3 || hc.Test[0] != "CMD" {
			t.Errorf("%s: health check %q: want [CMD, /healthcheck, URL]: the image has no shell", where, hc.Test)
			continue
		}
		if pkg := info.img.files[hc.Test[1]]; pkg != "./deploy/docker/healthcheck" {
			t.Errorf("%s: health check runs %s, which %s does not build from ./deploy/docker/healthcheck", where, hc.Test[1], info.img.dockerfile)
		}
		u, err := url.Parse(hc.Test[2])
		if err != nil || u.Scheme != "http" || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
			t.Errorf("%s: health check URL %s: want http://127.0.0.1:PORT/PATH, in its own container", where, hc.Test[2])
		} else if p, _ := strconv.Atoi(u.Port()); info.listens[p] == "" && !info.broken {
			t.Errorf("%s: health check URL %s: nothing listens on %s (it listens on %v)", where, hc.Test[2], u.Port(), info.listens)
		}
		// Migrations run before the server listens; the kustomize startup probe gives
		// them a minute.
		interval, err1 := time.ParseDuration(hc.Interval)
		_, err2 := time.ParseDuration(hc.Timeout)
		if err1 != nil || err2 != nil || time.Duration(hc.Retries)*interval < time.Minute {
			t.Errorf("%s: health check interval %q timeout %q retries %d: want valid durations and at least a minute before unhealthy", where, hc.Interval, hc.Timeout, hc.Retries)
		}
	}
}

// checkComposeURL requires a URL to name a compose service the caller shares a network
// with, on a port that service listens on (the listener u.want when set), and checks
// Postgres URLs against the Postgres service's credentials.
func checkComposeURL(t *testing.T, c *composeProject, infos map[string]*composeInfo, from *composeInfo, u urlUse) {
	t.Helper()
	where := fmt.Sprintf("service %s %s", from.name, u.where)
	parsed, err := url.Parse(u.raw)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	to := infos[parsed.Hostname()]
	if to == nil {
		t.Errorf("%s: %s: no service %s", where, u.raw, parsed.Hostname())
		return
	}
	if !slices.ContainsFunc(networksOf(from.svc), func(n string) bool { return slices.Contains(networksOf(to.svc), n) }) {
		t.Errorf("%s: %s: %s and %s share no network", where, u.raw, from.name, to.name)
	}
	port := parsed.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443", "postgres": "5432", "postgresql": "5432"}[parsed.Scheme]
	}
	p, _ := strconv.Atoi(port)
	got, ok := to.listens[p]
	if to.broken {
		ok, got = true, u.want // its ports are unknown, for a reason already reported
	}
	want := u.want
	if parsed.Scheme == "postgres" || parsed.Scheme == "postgresql" {
		want = "postgres"
	}
	switch {
	case !ok:
		t.Errorf("%s: %s: %s listens on %v, not %s", where, u.raw, to.name, to.listens, port)
	case want != "" && got != want:
		t.Errorf("%s: %s: port %s of %s is its %s, want its %s", where, u.raw, port, to.name, got, want)
	}
	if want == "postgres" {
		env := to.svc.Environment
		pw, _ := parsed.User.Password()
		if parsed.User.Username() != env["POSTGRES_USER"] || pw != env["POSTGRES_PASSWORD"] || strings.TrimPrefix(parsed.Path, "/") != env["POSTGRES_DB"] {
			t.Errorf("%s: %s: %s has user %q, password %q, database %q", where, u.raw, to.name, env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"])
		}
	}
}

func networksOf(svc *composeService) []string {
	if len(svc.Networks) == 0 {
		return []string{"default"}
	}
	return svc.Networks
}

// checkDependsOn requires the start order to exist (no cycle, no missing service, no
// service left out by a profile) and every service to wait for what it calls: healthy
// when that has a health check.
func checkDependsOn(t *testing.T, c *composeProject, infos map[string]*composeInfo) {
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		svc := c.Services[name]
		for dep, d := range svc.DependsOn {
			to := c.Services[dep]
			if to == nil {
				t.Errorf("service %s depends on %s, which is not a service", name, dep)
				continue
			}
			for _, p := range to.Profiles {
				if !slices.Contains(svc.Profiles, p) {
					t.Errorf("service %s depends on %s, which only profile %s starts", name, dep, p)
				}
			}
			switch d.Condition {
			case "service_healthy":
				if to.Healthcheck == nil || to.Healthcheck.Disable {
					t.Errorf("service %s waits for %s to be healthy, which has no health check", name, dep)
				}
			case "service_started", "service_completed_successfully":
			default:
				t.Errorf("service %s depends on %s with condition %q", name, dep, d.Condition)
			}
		}
		for _, u := range infos[name].urls {
			parsed, err := url.Parse(u.raw)
			if err != nil || c.Services[parsed.Hostname()] == nil {
				continue // reported with the URLs
			}
			dep := parsed.Hostname()
			d, ok := svc.DependsOn[dep]
			want := "service_started"
			if hc := c.Services[dep].Healthcheck; hc != nil && !hc.Disable {
				want = "service_healthy"
			}
			if !ok || d.Condition != want {
				t.Errorf("service %s calls %s (%s) but does not wait for it with condition %s", name, dep, u.where, want)
			}
		}
	}
	// No cycle: a depth-first walk meets no service still on its path.
	state := map[string]int{} // 1 on the path, 2 done
	var visit func(name string, trail []string)
	visit = func(name string, trail []string) {
		switch state[name] {
		case 1:
			t.Errorf("depends_on cycle: %s", strings.Join(append(trail, name), " → "))
			return
		case 2:
			return
		}
		state[name] = 1
		for _, dep := range slices.Sorted(maps.Keys(c.Services[name].DependsOn)) {
			if c.Services[dep] != nil {
				visit(dep, append(trail, name))
			}
		}
		state[name] = 2
	}
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		visit(name, nil)
	}
}

// startOrder lists the services so that each comes after what it depends on.
func startOrder(c *composeProject) []string {
	var order []string
	seen := map[string]bool{}
	var visit func(string)
	visit = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		for _, dep := range slices.Sorted(maps.Keys(c.Services[name].DependsOn)) {
			visit(dep)
		}
		order = append(order, name)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		visit(name)
	}
	return order
}

func portOf(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// ---------------------------------------------------------------------------------------
// Running it
