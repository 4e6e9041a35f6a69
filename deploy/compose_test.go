package deploy_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/pem"
	"errors"
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
	"sync"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/graph"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/tree"
	"github.com/compose-spec/compose-go/v2/types"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/repo"
)

// composeKeys are the keys of docker-compose.yaml this test checks, in compose-go's
// canonical form (short syntaxes in their long form): another key fails it, so that
// nothing added to the file goes unchecked.
var composeKeys = []tree.Path{
	"name", "networks.*.name", "networks.*.external", "volumes.*",
	"services.*.profiles", "services.*.image", "services.*.build.context", "services.*.build.dockerfile",
	"services.*.command", "services.*.environment.*", "services.*.tmpfs", "services.*.networks.*",
	"services.*.ports.[].host_ip", "services.*.ports.[].published", "services.*.ports.[].target",
	"services.*.ports.[].protocol", "services.*.ports.[].mode",
	"services.*.volumes.[].type", "services.*.volumes.[].source", "services.*.volumes.[].target",
	"services.*.volumes.[].read_only", "services.*.volumes.[].bind.create_host_path", "services.*.volumes.[].volume",
	"services.*.healthcheck.test", "services.*.healthcheck.interval", "services.*.healthcheck.timeout",
	"services.*.healthcheck.retries", "services.*.healthcheck.disable",
	"services.*.depends_on.*.condition", "services.*.depends_on.*.required",
	"services.*.read_only", "services.*.cap_drop", "services.*.security_opt", "services.*.stop_grace_period", "services.*.user",
	"services.*.configs.[].source", "services.*.configs.[].target", "configs.*.content",
}

// rpcListener is the flag naming the RPC address of the services; URLs to them over
// http must reach it. consoleListener names the events service's console.
const (
	rpcListener     = "listen"
	consoleListener = "console-listen"
)

// urlFlags are the flags whose values are URLs the service calls, with the listener of
// the service each must reach ("": the one its scheme says, see schemeListeners). The
// events service's --cloudevents-config names more (sinksFile).
var urlFlags = map[string]string{"jaeger-query-url": "ui", "cloudevents-sink": ""}

// schemeListeners are the listeners URLs of a scheme must reach, and the port they mean
// when they name none.
var schemeListeners = map[string]struct {
	listener string
	port     string
}{
	"postgres": {"postgres", "5432"}, "postgresql": {"postgres", "5432"},
	"nats": {natsListener, "4222"},
	"http": {"", "80"}, "https": {"", "443"},
}

// configInfo is what a binary's --config file says: what it listens on, the URLs it
// calls and the files it reads.
type configInfo struct {
	listens map[int]string    // port → setting
	urls    map[string]string // setting → URL
	files   map[string]string // setting → path, as the file names it
}

// configFiles read a binary's --config file as the binary does (defaults for ""). The
// files it names are where resolve says they are here (nil: where the file says), since
// the binary checks them at start.
var configFiles = map[string]func(file string, resolve func(path string) (string, error)) (*configInfo, error){
	"executor": loadExecutorConfig,
}

func loadExecutorConfig(file string, resolve func(string) (string, error)) (*configInfo, error) {
	info := &configInfo{listens: map[int]string{}, urls: map[string]string{}, files: map[string]string{}}
	local := file
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		for _, setting := range []string{"serviceTokenFile", "serviceCAFile"} {
			path, _ := m[setting].(string)
			if path == "" {
				continue
			}
			info.files[setting] = path
			if resolve != nil {
				if m[setting], err = resolve(path); err != nil {
					return nil, fmt.Errorf("%s: %w", setting, err)
				}
			}
		}
		if resolve != nil && len(info.files) > 0 {
			out, err := yaml.Marshal(m)
			if err != nil {
				return nil, err
			}
			tmp, err := os.CreateTemp("", "executor-config-*.yaml")
			if err != nil {
				return nil, err
			}
			defer func() { _ = os.Remove(tmp.Name()) }()
			_, err = tmp.Write(out)
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
			local = tmp.Name()
		}
	}
	cfg, err := config.Load(local)
	if err != nil {
		return nil, err
	}
	for name, addr := range map[string]string{
		"healthProbeBindAddress": cfg.HealthProbeBindAddress,
		"metricsBindAddress":     cfg.MetricsBindAddress,
	} {
		if addr != "0" && addr != "" {
			p, err := portOf(addr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			info.listens[p] = name
		}
	}
	for name, u := range map[string]string{"eventsServiceURL": cfg.EventsServiceURL, "cacheServiceURL": cfg.CacheServiceURL} {
		if u != "" {
			info.urls[name] = u
		}
	}
	return info, nil
}

// composeInfo is what the checks need to know of a service, worked out once.
type composeInfo struct {
	name    string
	svc     types.ServiceConfig
	env     map[string]string                    // its environment
	img     *image                               // nil for upstream images
	bin     *goBinary                            // nil for upstream images
	args    map[string]string                    // flag → value, given or default
	given   map[string][]string                  // flag → every value given, in order
	standIn any                                  // what an upstream image's command says, for its stand-in
	listens map[int]string                       // container port → listener name
	mounts  map[string]types.ServiceVolumeConfig // by target
	config  string                               // host path of the --config file, if any
	cfg     *configInfo                          // what the --config file says, if any
	configs map[string]string                    // container path → host file, of its compose configs
	sinks   []cloudevents.SinkSpec               // its --cloudevents-config's sinks, if any
	urls    []urlUse
	broken  bool // its command or --config is wrong (reported): its ports are unknown
	oneShot bool // run once to completion before the services that wait for it
	vols    map[string]string
	root    string
}

// hostPath is where a path in the service's container is here: under the repository
// for a bind mount of one of its files, in the stand-in directory of a named volume, a
// file holding a compose config's content.
func (info *composeInfo) hostPath(path string) (string, error) {
	if f, ok := info.configs[path]; ok {
		return f, nil
	}
	best := ""
	for target := range info.mounts {
		if (path == target || strings.HasPrefix(path, strings.TrimSuffix(target, "/")+"/")) && len(target) > len(best) {
			best = target
		}
	}
	if best == "" {
		return "", fmt.Errorf("%s is in no volume of service %s", path, info.name)
	}
	m, rest := info.mounts[best], strings.TrimPrefix(path, best)
	switch {
	case m.Type == types.VolumeTypeBind && inRepo(info.root, m.Source):
		return filepath.Join(m.Source, filepath.FromSlash(rest)), nil
	case m.Type == types.VolumeTypeVolume && info.vols[m.Source] != "":
		return filepath.Join(info.vols[m.Source], filepath.FromSlash(rest)), nil
	}
	return "", fmt.Errorf("%s: nothing stands in here for %s (mounted from %s)", path, best, m.Source)
}

// oneShots are the services others wait for with service_completed_successfully: they
// run once, to completion, before them.
func oneShots(c *types.Project) map[string]bool {
	out := map[string]bool{}
	for _, svc := range c.Services {
		for dep, d := range svc.DependsOn {
			if d.Condition == types.ServiceConditionCompletedSuccessfully {
				out[dep] = true
			}
		}
	}
	return out
}

// urlUse is a URL a service calls: where it is set, and which listener it must reach
// ("" for any).
type urlUse struct{ where, raw, want string }

// TestCompose checks docker-compose.yaml and the Dockerfiles it builds against the code,
// since no Docker engine runs where the tests run: each binary is built as its Dockerfile
// builds it, and compose's flags (parsed with the flag set each binary registers),
// environment, URLs, ports, mounts, health checks and start order are held to what the
// binaries read and serve. Then it runs what compose would run, as plain processes
// (runCompose).
func TestCompose(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	c := loadCompose(t, root)
	images := map[string]*image{} // by service
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		if b := c.Services[name].Build; b != nil {
			if b.Context != root {
				t.Errorf("service %s builds from context %q: the Dockerfiles expect the repository root", name, b.Context)
			}
			images[name] = loadImage(t, root, b.Dockerfile)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	bins := buildBinaries(t, root, images)
	// Named volumes are directories here, shared by the services that mount them.
	vols := map[string]string{}
	for name := range c.Volumes {
		vols[name] = filepath.Join(t.TempDir(), name)
		if err := os.Mkdir(vols[name], 0o700); err != nil {
			t.Fatal(err)
		}
	}
	infos := composeInfos(t, root, c, images, bins, vols)

	t.Run("dockerfiles", func(t *testing.T) { checkDockerfiles(t, root, images, bins, oneShots(c)) })
	t.Run("dockerignore", func(t *testing.T) { checkDockerignore(t, root, bins) })
	t.Run("services", func(t *testing.T) {
		checkComposeServices(t, root, c, infos, bins["./deploy/docker/healthcheck"])
		checkNATSStreams(t, infos)
	})
	t.Run("depends_on", func(t *testing.T) { checkDependsOn(t, c, infos) })
	if t.Failed() {
		return // running what is known to be wrong would only add noise
	}
	t.Run("run", func(t *testing.T) { runCompose(t, root, c, infos, bins, vols) })
}

// loadCompose reads docker-compose.yaml as docker compose does, with every profile on
// and no variable set (so ${VAR:-default} takes its default): compose-go validates it
// against the specification's schema, interpolates it, turns short syntaxes into long
// ones and requires every network, volume and service a service names to be declared
// and depends_on to have no cycle.
func loadCompose(t *testing.T, root string) *types.Project {
	t.Helper()
	details := types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, "docker-compose.yaml")}},
		Environment: types.Mapping{},
	}
	c, err := loader.LoadWithContext(t.Context(), details, loader.WithProfiles([]string{"*"}),
		loader.WithSupportedAttributes(composeKeys, func(found []loader.UnsupportedAttribute) {
			for _, a := range found {
				t.Errorf("docker-compose.yaml: %s: teach this test the key (composeKeys), or it goes unchecked", a.Path)
			}
		}))
	if err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yaml has no services")
	}
	return c
}

// inRepo reports whether a bind mount's source (absolute, as compose-go resolves it) is
// a file of this repository rather than the user's.
func inRepo(root, source string) bool {
	rel, err := filepath.Rel(root, source)
	return err == nil && filepath.IsLocal(rel)
}

// environment is a service's environment, every variable set.
func environment(svc types.ServiceConfig) map[string]string {
	out := map[string]string{}
	for k, v := range svc.Environment {
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

// addrDefault matches a flag default that is an address: such a flag names a listener.
var addrDefault = regexp.MustCompile(`^[A-Za-z0-9.\-\[\]]*:\d+$`)

// composeInfos works out, for every service, its flags, listeners, mounts and the URLs
// it calls. Errors here are about the file, not the services. The services that others
// wait to complete are run here, in start order as compose runs them, so that the
// files they make are there to check where the others name them.
func composeInfos(t *testing.T, root string, c *types.Project, images map[string]*image, bins map[string]*goBinary, vols map[string]string) map[string]*composeInfo {
	t.Helper()
	infos := map[string]*composeInfo{}
	once := oneShots(c)
	for _, name := range startOrder(t, c) {
		svc := c.Services[name]
		info := &composeInfo{name: name, svc: svc, env: environment(svc), img: images[name], mounts: map[string]types.ServiceVolumeConfig{}, oneShot: once[name], vols: vols, root: root}
		infos[name] = info
		for _, m := range svc.Volumes {
			if _, dup := info.mounts[m.Target]; dup {
				t.Errorf("service %s mounts two volumes at %s", name, m.Target)
			}
			info.mounts[m.Target] = m
		}
		info.configs = configFilesOf(t, c, svc)
		if info.img == nil {
			repoName, _, _ := strings.Cut(svc.Image, ":")
			up, known := upstreamImages[repoName]
			info.listens = up.listens
			switch {
			case !known:
				t.Errorf("service %s: image %s is neither built here nor known to this test (upstreamImages)", name, svc.Image)
			case up.command != nil:
				cmd, err := up.command(info)
				if err != nil {
					t.Errorf("service %s: command %q: %v", name, svc.Command, err)
					info.broken = true
					break
				}
				info.listens, info.urls, info.standIn = cmd.listens, cmd.urls, cmd.standIn
			case len(svc.Command) > 0:
				t.Errorf("service %s: command %q: teach this test what %s does with it (upstreamImages)", name, svc.Command, svc.Image)
			}
			for k, v := range info.env {
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
		cmd, err := parseFlags(info.bin.pkg, append(info.img.entrypoint[1:], svc.Command...))
		if err == nil && len(cmd.args) > 0 {
			err = fmt.Errorf("arguments %q: the binary takes none but flags", cmd.args)
		}
		if err != nil {
			t.Errorf("service %s: command %q: %v", name, svc.Command, err)
			info.broken = true
			continue
		}
		info.args, info.given = cmd.values, cmd.given
		if file := info.args["config"]; file != "" {
			m, ok := info.mounts[file]
			switch {
			case !ok:
				t.Errorf("service %s: --config %s is not mounted", name, file)
			case m.Type != types.VolumeTypeBind || !inRepo(root, m.Source):
				t.Errorf("service %s: --config %s comes from %s, not a file of this repository", name, file, m.Source)
			default:
				info.config = m.Source
				if !m.ReadOnly {
					t.Errorf("service %s: --config %s is mounted writable", name, file)
				}
				if configFiles[info.bin.name] == nil {
					t.Errorf("service %s: teach this test to read %s's --config", name, info.bin.name)
				} else if info.cfg, err = configFiles[info.bin.name](info.config, info.hostPath); err != nil {
					t.Errorf("service %s: %s would not start with %s: %v", name, info.bin.name, m.Source, err)
					info.broken = true
					continue
				}
			}
		}
		if file := info.args["cloudevents-config"]; file != "" {
			if info.sinks, err = sinksFile(info, file); err != nil {
				t.Errorf("service %s: events would not start with --cloudevents-config %s: %v", name, file, err)
				info.broken = true
				continue
			}
			info.urls = append(info.urls, sinkURLs(info.sinks)...)
		}
		if info.listens, err = info.bin.listeners(info.args, info.cfg); err != nil {
			t.Errorf("service %s: %v", name, err)
			info.broken = true
		}
		for k, v := range info.env {
			if !strings.Contains(v, "://") {
				continue
			}
			want := ""
			switch k {
			case "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
				want = otlpListener(info.env)
			}
			info.urls = append(info.urls, urlUse{where: "env " + k, raw: v, want: want})
		}
		for flag, want := range urlFlags {
			values := info.given[flag]
			if len(values) == 0 && info.args[flag] != "" {
				values = []string{info.args[flag]} // its default
			}
			for _, v := range values {
				info.urls = append(info.urls, urlUse{where: "--" + flag, raw: v, want: want})
			}
		}
		if info.cfg != nil {
			for k, v := range info.cfg.urls {
				info.urls = append(info.urls, urlUse{where: "--config " + k, raw: v, want: rpcListener})
			}
		}
		slices.SortFunc(info.urls, func(a, b urlUse) int { return strings.Compare(a.where, b.where) })
		if info.oneShot {
			runOneShot(t, info)
		}
	}
	return infos
}

// configFilesOf writes the content of each compose config a service is given to a file
// here, by the path it has in the container (compose's default: /<name>).
func configFilesOf(t *testing.T, c *types.Project, svc types.ServiceConfig) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ref := range svc.Configs {
		target := cmp.Or(ref.Target, "/"+ref.Source)
		cfg, ok := c.Configs[ref.Source]
		if !ok || cfg.Content == "" {
			t.Errorf("service %s: config %s: want one declared with its content (content:), which this test reads", svc.Name, ref.Source)
			continue
		}
		file := filepath.Join(t.TempDir(), ref.Source)
		if err := os.WriteFile(file, []byte(cfg.Content), 0o600); err != nil {
			t.Fatal(err)
		}
		out[target] = file
	}
	return out
}

// sinksFile reads the events service's --cloudevents-config as the service does, and
// requires the files its sinks read to be in the container.
func sinksFile(info *composeInfo, path string) ([]cloudevents.SinkSpec, error) {
	file, err := info.hostPath(path)
	if err != nil {
		return nil, err
	}
	if _, err := cloudevents.Load(file); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(file)
	var f cloudevents.File
	if err == nil {
		err = yaml.Unmarshal(data, &f)
	}
	for i, s := range f.Sinks {
		var files []string
		switch {
		case s.HTTP != nil:
			files = []string{s.HTTP.CAFile, s.HTTP.TokenFile}
		case s.NATS != nil:
			files = []string{s.NATS.CAFile, s.NATS.TokenFile}
		case s.Kafka != nil:
			files = []string{s.Kafka.CAFile}
		}
		for _, read := range files {
			if _, herr := info.hostPath(read); read != "" && herr != nil {
				err = errors.Join(err, fmt.Errorf("sinks[%d]: %w", i, herr))
			}
		}
	}
	return f.Sinks, err
}

// sinkURLs are the URLs a service's sinks call: an HTTP receiver's, a broker's
// servers' as nats://host:port or kafka://host:port.
func sinkURLs(sinks []cloudevents.SinkSpec) []urlUse {
	var out []urlUse
	for i, s := range sinks {
		where := fmt.Sprintf("--cloudevents-config sinks[%d]", i)
		switch {
		case s.HTTP != nil:
			out = append(out, urlUse{where: where, raw: s.HTTP.URL})
		case s.NATS != nil:
			for _, server := range s.NATS.Servers {
				out = append(out, urlUse{where: where, raw: "nats://" + server})
			}
		case s.Kafka != nil:
			for _, broker := range s.Kafka.Brokers {
				out = append(out, urlUse{where: where, raw: "kafka://" + broker})
			}
		}
	}
	return out
}

// otlpListener is the Jaeger port OTLP traces go to with the protocol the environment
// selects; services/telemetry's default protocol is http/protobuf.
func otlpListener(env map[string]string) string {
	protocol := cmp.Or(env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"], env["OTEL_EXPORTER_OTLP_PROTOCOL"], "http/protobuf")
	if protocol == "grpc" {
		return "otlp-grpc"
	}
	return "otlp-http"
}

// checkComposeServices checks each service against its image and binary.
func checkComposeServices(t *testing.T, root string, c *types.Project, infos map[string]*composeInfo, healthcheck *goBinary) {
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
		for target, m := range info.mounts {
			switch {
			case m.Type == types.VolumeTypeVolume: // declared, or compose-go would have refused the file
			case m.Type == types.VolumeTypeBind && inRepo(root, m.Source):
				if _, err := os.Stat(m.Source); err != nil {
					t.Errorf("%s: mount %s: %v", where, target, err)
				}
			case m.Type == types.VolumeTypeBind:
				// The user's own file (a kubeconfig): it must exist, not be created empty.
				if m.Bind == nil || bool(m.Bind.CreateHostPath) {
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
			mapping := fmt.Sprintf("%s:%s:%d", p.HostIP, p.Published, p.Target)
			if p.HostIP != "127.0.0.1" || p.Published == "" {
				t.Errorf("%s: port %q is not published on 127.0.0.1 only (want 127.0.0.1:HOST:CONTAINER)", where, mapping)
				continue
			}
			if other, dup := hostPorts[p.Published]; dup {
				t.Errorf("%s: host port %s is %s's too", where, p.Published, other)
			}
			hostPorts[p.Published] = name
			if info.listens[int(p.Target)] == "" {
				t.Errorf("%s: port %q: nothing in the container listens on %d (it listens on %v)", where, mapping, p.Target, info.listens)
			}
		}
		for _, u := range info.urls {
			checkComposeURL(t, c, infos, info, u)
		}
		if hc := svc.HealthCheck; hc != nil && hc.Disable {
			t.Errorf("%s: health check disabled", where)
		}
		if info.img == nil {
			continue
		}

		// A service built here.
		if info.oneShot {
			// Not a service of the cluster: it makes what the services read, once.
			if len(svc.Ports) > 0 || svc.HealthCheck != nil {
				t.Errorf("%s: runs once for others, so it publishes no port and has no health check", where)
			}
		} else if want := kustomizeImages[info.img.binary]; svc.Image != want {
			t.Errorf("%s: image %s, the kustomize base runs %q", where, svc.Image, want)
		}
		if info.bin == nil || info.bin.flags == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(info.env)) {
			v := info.env[k]
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
		checkServiceSecurity(t, info)
		if info.oneShot {
			continue
		}
		hc := svc.HealthCheck
		if hc == nil {
			t.Errorf("%s: no health check", where)
			continue
		}
		if len(hc.Test) < 3 || hc.Test[0] != "CMD" {
			t.Errorf("%s: health check %q: want [CMD, /healthcheck, FLAGS..., URL]: the image has no shell", where, hc.Test)
			continue
		}
		if pkg := info.img.files[hc.Test[1]]; pkg != "./deploy/docker/healthcheck" {
			t.Errorf("%s: health check runs %s, which %s does not build from ./deploy/docker/healthcheck", where, hc.Test[1], info.img.dockerfile)
		}
		hcFlags, target, err := healthcheckArgs(hc.Test, healthcheck)
		if err != nil {
			t.Errorf("%s: health check %q: %v", where, hc.Test, err)
			continue
		}
		u, err := url.Parse(target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
			t.Errorf("%s: health check URL %s: want http(s)://127.0.0.1:PORT/PATH, in its own container", where, target)
		} else if p, _ := strconv.Atoi(u.Port()); info.listens[p] == "" && !info.broken {
			t.Errorf("%s: health check URL %s: nothing listens on %s (it listens on %v)", where, target, u.Port(), info.listens)
		} else if tlsOn := info.servesTLS(p); tlsOn != (u.Scheme == "https") {
			t.Errorf("%s: health check URL %s, but port %d serves TLS: %v", where, target, p, tlsOn)
		} else if tlsOn {
			// The CA it trusts must be the one that signed the certificate served there.
			ca, err1 := info.hostPath(hcFlags["cacert"])
			cert, err2 := info.hostPath(info.args["tls-cert-file"])
			if err := errors.Join(err1, err2, verifyCert(cert, ca, u.Hostname())); err != nil {
				t.Errorf("%s: health check -cacert=%s: %v", where, hcFlags["cacert"], err)
			}
		}
		// Under compose the services apply their migrations at start, before they
		// listen (in Kubernetes a Job runs them: deploy/kustomize/base/migrate).
		if hc.Interval == nil || hc.Timeout == nil || hc.Retries == nil || time.Duration(*hc.Retries)*time.Duration(*hc.Interval) < time.Minute {
			t.Errorf("%s: health check interval %v timeout %v retries %v: want all three and at least a minute before unhealthy", where, hc.Interval, hc.Timeout, hc.Retries)
		}
	}
}

// checkComposeURL requires a URL to name a compose service the caller shares a network
// with, on a port that service listens on (the listener u.want when set), and checks
// Postgres URLs against the Postgres service's credentials.
func checkComposeURL(t *testing.T, c *types.Project, infos map[string]*composeInfo, from *composeInfo, u urlUse) {
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
	if !slices.ContainsFunc(slices.Collect(maps.Keys(from.svc.Networks)), func(n string) bool { _, ok := to.svc.Networks[n]; return ok }) {
		t.Errorf("%s: %s: %s and %s share no network", where, u.raw, from.name, to.name)
	}
	port := cmp.Or(parsed.Port(), schemeListeners[parsed.Scheme].port)
	p, _ := strconv.Atoi(port)
	want := cmp.Or(schemeListeners[parsed.Scheme].listener, u.want)
	got, ok := to.listens[p]
	if to.broken {
		ok, got = true, want // its ports are unknown, for a reason already reported
	}
	switch {
	case !ok:
		t.Errorf("%s: %s: %s listens on %v, not %s", where, u.raw, to.name, to.listens, port)
	case want != "" && got != want:
		t.Errorf("%s: %s: port %s of %s is its %s, want its %s", where, u.raw, port, to.name, got, want)
	case to.servesTLS(p) != (parsed.Scheme == "https"):
		t.Errorf("%s: %s: port %s of %s serves TLS: %v", where, u.raw, port, to.name, to.servesTLS(p))
	case to.servesTLS(p) && from.cfg != nil:
		checkCallerCredentials(t, where, from, to, parsed.Hostname())
	}
	if want == "postgres" {
		env := to.env
		pw, _ := parsed.User.Password()
		if parsed.User.Username() != env["POSTGRES_USER"] || pw != env["POSTGRES_PASSWORD"] || strings.TrimPrefix(parsed.Path, "/") != env["POSTGRES_DB"] {
			t.Errorf("%s: %s: %s has user %q, password %q, database %q", where, u.raw, to.name, env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"])
		}
	}
}

// checkDependsOn requires every service to wait for what it calls (healthy when that
// has a health check) and for the one-shot services whose volumes it reads, and no
// service to depend on one that only a profile it lacks starts. compose-go has already
// refused a cycle or a missing service.
func checkDependsOn(t *testing.T, c *types.Project, infos map[string]*composeInfo) {
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		svc := c.Services[name]
		for _, dep := range slices.Sorted(maps.Keys(svc.DependsOn)) {
			to := c.Services[dep]
			for _, p := range to.Profiles {
				if !slices.Contains(svc.Profiles, p) {
					t.Errorf("service %s depends on %s, which only profile %s starts", name, dep, p)
				}
			}
			if d := svc.DependsOn[dep]; d.Condition == types.ServiceConditionHealthy && (to.HealthCheck == nil || to.HealthCheck.Disable) {
				t.Errorf("service %s waits for %s to be healthy, which has no health check", name, dep)
			}
		}
		for _, u := range infos[name].urls {
			parsed, err := url.Parse(u.raw)
			if err != nil {
				continue // reported with the URLs
			}
			dep := parsed.Hostname()
			to, ok := c.Services[dep]
			if !ok {
				continue // reported with the URLs
			}
			want := types.ServiceConditionStarted
			if hc := to.HealthCheck; hc != nil && !hc.Disable {
				want = types.ServiceConditionHealthy
			}
			if d, ok := svc.DependsOn[dep]; !ok || d.Condition != want {
				t.Errorf("service %s calls %s (%s) but does not wait for it with condition %s", name, dep, u.where, want)
			}
		}
	}
	// What a one-shot service writes into a volume is read only after it has completed.
	once := oneShots(c)
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		for _, m := range c.Services[name].Volumes {
			for _, writer := range slices.Sorted(maps.Keys(once)) {
				if writer == name || m.Type != types.VolumeTypeVolume || !slices.ContainsFunc(c.Services[writer].Volumes, func(w types.ServiceVolumeConfig) bool {
					return w.Source == m.Source && !w.ReadOnly
				}) {
					continue
				}
				if d, ok := c.Services[name].DependsOn[writer]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
					t.Errorf("service %s reads volume %s, which %s writes, without waiting for it to complete", name, m.Source, writer)
				}
				if !m.ReadOnly {
					t.Errorf("service %s mounts volume %s writable: only %s, which makes it, needs to write it", name, m.Source, writer)
				}
			}
		}
	}
}

// startOrder lists the services so that each comes after what it depends on, as
// compose starts them.
func startOrder(t *testing.T, c *types.Project) []string {
	t.Helper()
	var mu sync.Mutex
	var order []string
	err := graph.InDependencyOrder(t.Context(), c, func(_ context.Context, name string, _ types.ServiceConfig) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, name)
		return nil
	}, graph.WithMaxConcurrency(1))
	if err != nil {
		t.Fatal(err)
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

// servesTLS says whether the service speaks TLS on port: its RPC listener given a
// certificate, and its console too unless told to speak plain HTTP.
func (info *composeInfo) servesTLS(port int) bool {
	if info.args["tls-cert-file"] == "" {
		return false
	}
	switch info.listens[port] {
	case rpcListener:
		return true
	case consoleListener:
		return info.args["console-plaintext"] != "true"
	}
	return false
}

// checkServiceSecurity holds a service that authenticates its callers to what a cluster
// runs: an auth mode that is not none, TLS, and every file they name in its volumes.
func checkServiceSecurity(t *testing.T, info *composeInfo) {
	t.Helper()
	if _, ok := info.bin.flags["auth-mode"]; !ok {
		return
	}
	where := "service " + info.name
	switch mode := info.args["auth-mode"]; mode {
	case "kubernetes":
	case "token-file":
		if _, err := tokensByGroup(info, info.args["auth-token-file"]); err != nil {
			t.Errorf("%s: --auth-token-file: %v", where, err)
		}
	default:
		t.Errorf("%s: --auth-mode=%q: want token-file (or kubernetes), so that only callers with a token reach it", where, mode)
	}
	if info.args["tls-cert-file"] == "" || info.args["tls-key-file"] == "" {
		t.Errorf("%s: no --tls-cert-file and --tls-key-file: tokens would cross the network in the clear", where)
		return
	}
	cert, err1 := info.hostPath(info.args["tls-cert-file"])
	key, err2 := info.hostPath(info.args["tls-key-file"])
	if err := errors.Join(err1, err2); err != nil {
		t.Errorf("%s: %v", where, err)
	} else if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
		t.Errorf("%s: its certificate and key: %v", where, err)
	}
}

// checkCallerCredentials requires a caller's --config to trust a CA that signed the
// service's certificate for host, and to send a token the service's token file gives
// the executors' group.
func checkCallerCredentials(t *testing.T, where string, from, to *composeInfo, host string) {
	t.Helper()
	caPath, tokenPath := from.cfg.files["serviceCAFile"], from.cfg.files["serviceTokenFile"]
	if caPath == "" || tokenPath == "" {
		t.Errorf("%s: %s serves TLS with a private CA and wants a token: the config names serviceCAFile %q and serviceTokenFile %q", where, to.name, caPath, tokenPath)
		return
	}
	ca, err1 := from.hostPath(caPath)
	cert, err2 := to.hostPath(to.args["tls-cert-file"])
	if err := errors.Join(err1, err2, verifyCert(cert, ca, host)); err != nil {
		t.Errorf("%s: serviceCAFile %s: %v", where, caPath, err)
	}
	file, err := from.hostPath(tokenPath)
	var token []byte
	if err == nil {
		token, err = os.ReadFile(file)
	}
	if err != nil {
		t.Errorf("%s: serviceTokenFile: %v", where, err)
		return
	}
	if to.args["auth-mode"] == "token-file" {
		tokens, err := tokensByGroup(to, to.args["auth-token-file"])
		if err == nil && tokens[auth.Executors] != strings.TrimSpace(string(token)) {
			t.Errorf("%s: serviceTokenFile %s is not in %s's token file as %s", where, tokenPath, to.name, auth.Executors)
		}
	}
}

// tokensByGroup reads a token file in the container path's place (kube-apiserver's
// static token CSV), giving the first token of each group.
func tokensByGroup(info *composeInfo, path string) (map[string]string, error) {
	file, err := info.hostPath(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	records, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]string{}
	for _, rec := range records {
		if len(rec) < 4 {
			continue
		}
		for _, g := range strings.Split(rec[3], ",") {
			if out[g] == "" {
				out[g] = rec[0]
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no token with a group", path)
	}
	return out, nil
}

// verifyCert checks that the PEM certificate in certFile is valid for host under the CAs
// of caFile.
func verifyCert(certFile, caFile, host string) error {
	if certFile == "" || caFile == "" {
		return nil // reported by the caller
	}
	pool, err := rpcclient.LoadCAFile(caFile)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return fmt.Errorf("%s holds no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
	return err
}

// healthcheckArgs splits a health check's test into the flags of /healthcheck, by name,
// and its URL, the last argument.
func healthcheckArgs(test []string, healthcheck *goBinary) (map[string]string, string, error) {
	if len(test) < 3 {
		return nil, "", errors.New("want [CMD, /healthcheck, FLAGS..., URL]")
	}
	if healthcheck == nil || healthcheck.flags == nil {
		return nil, "", errors.New("no /healthcheck binary to read the flags of")
	}
	p, err := parseFlags(healthcheck.pkg, test[2:])
	if err != nil {
		return nil, "", err
	}
	if len(p.args) != 1 {
		return nil, "", fmt.Errorf("arguments %q: want one URL after the flags", p.args)
	}
	return p.values, p.args[0], nil
}
