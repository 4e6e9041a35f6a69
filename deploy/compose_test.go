package deploy_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
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

	"github.com/flytekube/backend/executor/config"
	_ "github.com/flytekube/backend/gen/go/flyte/cache/v1"  // the descriptors of the RPCs runCompose calls
	_ "github.com/flytekube/backend/gen/go/flyte/events/v1" // the descriptors of the RPCs runCompose calls
	"github.com/flytekube/backend/internal/pgtest"
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

// image is what a Dockerfile builds, as far as can be told without building it.
type image struct {
	dockerfile string // relative to the repository root
	binary     string // "events", from "events.Dockerfile"
	entrypoint []string
	files      map[string]string // path in the final image → the Go package built there
	builds     []goBuild
	exposed    []int
	stages     []*dockerStage
}

type dockerStage struct {
	name, base string
	instrs     []dockerInstr
}

type dockerInstr struct {
	line  int
	cmd   string   // upper case
	flags []string // --from=build, --mount=...
	args  string
}

// goBuild is one `go build` of a RUN instruction.
type goBuild struct {
	stage  string
	env    []string // the assignments before "go", as written
	flags  []string // every flag but -o
	out    string
	pkg    string
	mounts []string // the RUN's --mount flags
}

var goVersionLine = regexp.MustCompile(`(?m)^go (\d+\.\d+)`)

func loadImage(t *testing.T, root, dockerfile string) *image {
	t.Helper()
	where := dockerfile
	data, err := os.ReadFile(filepath.Join(root, dockerfile))
	if err != nil {
		t.Fatalf("%v", err)
	}
	img := &image{dockerfile: dockerfile, binary: strings.TrimSuffix(path.Base(dockerfile), ".Dockerfile"), files: map[string]string{}}
	img.stages, err = parseDockerfile(string(data))
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if len(img.stages) < 2 {
		t.Fatalf("%s: not a multi-stage build", where)
	}
	stageNames := map[string]bool{}
	for _, s := range img.stages[:len(img.stages)-1] {
		stageNames[s.name] = true
		for _, in := range s.instrs {
			if in.cmd != "RUN" {
				continue
			}
			builds, err := goBuilds(in)
			if err != nil {
				t.Errorf("%s:%d: %v", where, in.line, err)
			}
			for _, b := range builds {
				b.stage = s.name
				img.builds = append(img.builds, b)
			}
		}
	}
	final := img.stages[len(img.stages)-1]
	for _, in := range final.instrs {
		switch in.cmd {
		case "COPY":
			from := flagValue(in.flags, "from")
			words, err := shellWords(in.args)
			if err != nil || len(words) != 2 {
				t.Errorf("%s:%d: COPY %s: want one source and one destination", where, in.line, in.args)
				continue
			}
			if from == "" {
				t.Errorf("%s:%d: the final stage copies %s from the build context, not from a build stage", where, in.line, words[0])
				continue
			}
			if !stageNames[from] {
				t.Errorf("%s:%d: COPY --from=%s: no such stage", where, in.line, from)
				continue
			}
			for _, b := range img.builds {
				if b.stage == from && b.out == words[0] {
					img.files[words[1]] = b.pkg
				}
			}
			if _, ok := img.files[words[1]]; !ok {
				t.Errorf("%s:%d: COPY --from=%s %s: no go build in that stage writes it", where, in.line, from, words[0])
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &img.entrypoint); err != nil || len(img.entrypoint) == 0 {
				t.Errorf("%s:%d: ENTRYPOINT %s: want the exec form, a JSON array (there is no shell)", where, in.line, in.args)
			}
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					t.Errorf("%s:%d: EXPOSE %s: want a TCP port number", where, in.line, p)
				}
				img.exposed = append(img.exposed, n)
			}
		}
	}
	return img
}

// parseDockerfile splits a Dockerfile into stages of instructions: continuation lines
// joined, comments and parser directives dropped.
func parseDockerfile(text string) ([]*dockerStage, error) {
	var stages []*dockerStage
	var current strings.Builder
	start := 0
	flush := func() error {
		line := strings.TrimSpace(current.String())
		current.Reset()
		if line == "" {
			return nil
		}
		cmd, rest, _ := strings.Cut(line, " ")
		in := dockerInstr{line: start, cmd: strings.ToUpper(cmd)}
		rest = strings.TrimSpace(rest)
		for strings.HasPrefix(rest, "--") {
			var f string
			f, rest, _ = strings.Cut(rest, " ")
			in.flags = append(in.flags, strings.TrimPrefix(f, "--"))
			rest = strings.TrimSpace(rest)
		}
		in.args = rest
		if in.cmd == "FROM" {
			words := strings.Fields(rest)
			s := &dockerStage{base: words[0], name: strconv.Itoa(len(stages))}
			if len(words) == 3 && strings.EqualFold(words[1], "AS") {
				s.name = words[2]
			} else if len(words) != 1 {
				return fmt.Errorf("line %d: FROM %s", start, rest)
			}
			stages = append(stages, s)
		} else if len(stages) == 0 {
			if in.cmd != "ARG" {
				return fmt.Errorf("line %d: %s before FROM", start, in.cmd)
			}
			return nil
		}
		stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
		return nil
	}
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // comments, also inside continuations
		}
		if current.Len() == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), `\`); ok {
			current.WriteString(cont + " ")
			continue
		}
		current.WriteString(line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return stages, nil
}

// goBuilds finds the `go build` commands of a RUN instruction.
func goBuilds(in dockerInstr) ([]goBuild, error) {
	words, err := shellWords(in.args)
	if err != nil {
		return nil, err
	}
	var out []goBuild
	for cmd := range splitCommands(words) {
		i := 0
		for i < len(cmd) && strings.Contains(cmd[i], "=") && !strings.HasPrefix(cmd[i], "-") {
			i++
		}
		if len(cmd) < i+2 || cmd[i] != "go" || cmd[i+1] != "build" {
			continue
		}
		b := goBuild{env: cmd[:i]}
		for _, f := range in.flags {
			if v, ok := strings.CutPrefix(f, "mount="); ok {
				b.mounts = append(b.mounts, v)
			}
		}
		rest := cmd[i+2:]
		for j := 0; j < len(rest); j++ {
			w := rest[j]
			switch {
			case w == "-o":
				if j+1 == len(rest) {
					return nil, errors.New("go build -o without a file")
				}
				j++
				b.out = rest[j]
			case strings.HasPrefix(w, "-o="):
				b.out = strings.TrimPrefix(w, "-o=")
			case strings.HasPrefix(w, "-") && slices.Contains([]string{"-ldflags", "-gcflags", "-tags", "-mod", "-p"}, w):
				if j+1 == len(rest) {
					return nil, fmt.Errorf("go build %s without a value", w)
				}
				b.flags = append(b.flags, w+"="+rest[j+1])
				j++
			case strings.HasPrefix(w, "-"):
				b.flags = append(b.flags, w)
			default:
				if b.pkg != "" {
					return nil, fmt.Errorf("go build of %s and %s in one command: build one package per -o", b.pkg, w)
				}
				b.pkg = w
			}
		}
		if b.pkg == "" || b.out == "" {
			return nil, fmt.Errorf("go build %s: want -o FILE and one package", strings.Join(rest, " "))
		}
		out = append(out, b)
	}
	return out, nil
}

// splitCommands yields the simple commands of a shell word list.
func splitCommands(words []string) func(func([]string) bool) {
	return func(yield func([]string) bool) {
		var cmd []string
		for _, w := range append(words, ";") {
			if w == "&&" || w == "||" || w == ";" || w == "|" {
				if len(cmd) > 0 && !yield(cmd) {
					return
				}
				cmd = nil
				continue
			}
			cmd = append(cmd, w)
		}
	}
}

// shellWords splits a POSIX shell command into words, with quotes removed and the
// operators &&, ||, ; and | as words of their own. Expansions are left as written.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	end := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == ' ' || ch == '\t' || ch == '\n':
			end()
		case ch == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ' in %s", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case ch == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				w.WriteByte(s[i])
			}
			if i == len(s) {
				return nil, fmt.Errorf("unterminated \" in %s", s)
			}
			inWord = true
		case ch == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case ch == ';' || ch == '|' || ch == '&':
			end()
			op := string(ch)
			if i+1 < len(s) && s[i+1] == ch && ch != ';' {
				op += string(ch)
				i++
			}
			if op == "&" {
				return nil, fmt.Errorf("background command in %s", s)
			}
			words = append(words, op)
		default:
			w.WriteByte(ch)
			inWord = true
		}
	}
	end()
	return words, nil
}

func flagValue(flags []string, name string) string {
	for _, f := range flags {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}

// checkDockerfiles holds each Dockerfile to what the images promise: built with go.mod's
// Go, statically and reproducibly, with module and build caches; a distroless final
// stage running as non-root the binary of its name, exposing the ports that binary
// listens on by default; and no Dockerfile left unused by compose.
func checkDockerfiles(t *testing.T, root string, images map[string]*image, bins map[string]*goBinary) {
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := goVersionLine.FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	goVersion := string(m[1])
	used := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(images)) {
		img := images[name]
		where := img.dockerfile
		used[img.dockerfile] = true

		// The build stage.
		var built bool
		for _, s := range img.stages[:len(img.stages)-1] {
			repoName, tag, _ := strings.Cut(s.base, ":")
			if repoName == "golang" && tag != goVersion && !strings.HasPrefix(tag, goVersion+".") && !strings.HasPrefix(tag, goVersion+"-") {
				t.Errorf("%s: stage %s builds with %s, go.mod says go %s", where, s.name, s.base, goVersion)
			}
			var copiedAll, copiedMod, downloaded bool
			for _, in := range s.instrs {
				words := strings.Fields(in.args)
				switch {
				case in.cmd == "COPY" && slices.Equal(words, []string{".", "."}):
					copiedAll = true
				case in.cmd == "COPY" && len(words) > 2 && slices.Contains(words, "go.mod") && slices.Contains(words, "go.sum"):
					copiedMod = true
				case in.cmd == "RUN" && strings.Contains(in.args, "go mod download"):
					if copiedAll || !copiedMod {
						t.Errorf("%s:%d: go mod download must follow COPY go.mod go.sum and precede COPY . ., so that only they invalidate it", where, in.line)
					}
					if !slices.ContainsFunc(in.flags, func(f string) bool {
						return strings.Contains(f, "type=cache") && strings.Contains(f, "target=/go/pkg/mod")
					}) {
						t.Errorf("%s:%d: go mod download without a cache mount on /go/pkg/mod", where, in.line)
					}
					downloaded = true
				}
			}
			if repoName == "golang" {
				built = true
				if !downloaded {
					t.Errorf("%s: stage %s has no go mod download layer", where, s.name)
				}
			}
		}
		if !built {
			t.Errorf("%s: no golang build stage", where)
		}
		for _, b := range img.builds {
			if !slices.Contains(b.env, "CGO_ENABLED=0") {
				t.Errorf("%s: go build %s without CGO_ENABLED=0: distroless static has no libc", where, b.pkg)
			}
			if !slices.Contains(b.flags, "-trimpath") {
				t.Errorf("%s: go build %s without -trimpath", where, b.pkg)
			}
			if ld := flagValue(b.flags, "-ldflags"); !slices.Contains(strings.Fields(ld), "-s") || !slices.Contains(strings.Fields(ld), "-w") {
				t.Errorf("%s: go build %s: -ldflags %q lacks -s -w", where, b.pkg, ld)
			}
			for _, cache := range []string{"/go/pkg/mod", "/root/.cache/go-build"} {
				if !slices.ContainsFunc(b.mounts, func(m string) bool { return strings.Contains(m, "type=cache") && strings.Contains(m, "target="+cache) }) {
					t.Errorf("%s: go build %s without a cache mount on %s", where, b.pkg, cache)
				}
			}
		}

		// The final stage.
		final := img.stages[len(img.stages)-1]
		if !strings.HasPrefix(final.base, "gcr.io/distroless/static") && final.base != "scratch" {
			t.Errorf("%s: the final stage is %s, not distroless static or scratch", where, final.base)
		}
		user := ""
		labels := map[string]string{}
		for _, in := range final.instrs {
			switch in.cmd {
			case "USER":
				user = in.args
			case "LABEL":
				words, err := shellWords(in.args)
				if err != nil {
					t.Errorf("%s:%d: %v", where, in.line, err)
				}
				for _, w := range words {
					k, v, _ := strings.Cut(w, "=")
					labels[k] = v
				}
			case "RUN":
				t.Errorf("%s:%d: RUN in the final stage: it has no shell", where, in.line)
			}
		}
		uid, _, _ := strings.Cut(user, ":")
		switch {
		case uid == "" && !strings.HasSuffix(final.base, ":nonroot"):
			t.Errorf("%s: no USER, and %s runs as root", where, final.base)
		case uid == "0" || uid == "root":
			t.Errorf("%s: USER %s", where, user)
		case uid != "" && uid != "65532" && uid != "nonroot":
			t.Errorf("%s: USER %s, the manifests run uid 65532", where, user)
		}
		if labels["org.opencontainers.image.title"] != img.binary || labels["org.opencontainers.image.source"] == "" {
			t.Errorf("%s: OCI labels title=%q source=%q, want title %q and a source", where,
				labels["org.opencontainers.image.title"], labels["org.opencontainers.image.source"], img.binary)
		}

		// The binary: ./<binary>/cmd/<binary>, a main package, as the entrypoint.
		want := "./" + img.binary + "/cmd/" + img.binary
		if len(img.entrypoint) == 0 || img.files[img.entrypoint[0]] != want {
			t.Errorf("%s: ENTRYPOINT %q, want the file built from %s", where, img.entrypoint, want)
			continue
		}
		bin := bins[want]
		if bin == nil || bin.goName != "main" {
			t.Errorf("%s: %s is not a main package", where, want)
			continue
		}
		defaults, err := bin.listeners(nil, "")
		if err != nil {
			t.Errorf("%s: %v", where, err)
		}
		if got, want := slices.Sorted(slices.Values(img.exposed)), slices.Sorted(maps.Keys(defaults)); !slices.Equal(got, want) {
			t.Errorf("%s: EXPOSE %v, but %s listens on %v by default (%v)", where, got, img.binary, want, defaults)
		}
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "docker", "*Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		if !used[filepath.ToSlash(rel)] {
			t.Errorf("%s is built by no compose service", rel)
		}
	}
}

// ---------------------------------------------------------------------------------------
// The binaries

// goBinary is a binary as a Dockerfile builds it, and what it says of itself.
type goBinary struct {
	name   string // the last element of pkg
	pkg    string
	file   string
	goName string            // the package name
	flags  map[string]goFlag // from --help
	reads  func(env string) bool
}

type goFlag struct {
	typ, def string // typ is "" for booleans
}

var addrDefault = regexp.MustCompile(`^[A-Za-z0-9.\-\[\]]*:\d+$`)

// listeners returns the ports the binary listens on, by the flag or setting that says
// so: flags whose default is an address, and the settings of its --config file.
func (b *goBinary) listeners(args map[string]string, configFile string) (map[int]string, error) {
	out := map[int]string{}
	for name, f := range b.flags {
		if !addrDefault.MatchString(f.def) {
			continue
		}
		v, ok := args[name]
		if !ok {
			v = f.def
		}
		if v == "" {
			continue // disabled
		}
		p, err := portOf(v)
		if err != nil {
			return nil, fmt.Errorf("--%s=%s: %w", name, v, err)
		}
		out[p] = name
	}
	if load := configFiles[b.name]; load != nil {
		listens, _, err := load(configFile)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, listens)
	}
	return out, nil
}

// buildBinaries builds every package the Dockerfiles build, with their flags and
// environment, and asks each binary its flags.
func buildBinaries(t *testing.T, root string, images map[string]*image) map[string]*goBinary {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]*goBinary{}
	for _, name := range slices.Sorted(maps.Keys(images)) {
		for _, b := range images[name].builds {
			if bins[b.pkg] != nil {
				continue
			}
			var env []string
			for _, e := range b.env {
				if !strings.Contains(e, "$") { // GOOS=$TARGETOS: this machine's
					env = append(env, e)
				}
			}
			bin := &goBinary{name: path.Base(b.pkg), pkg: b.pkg}
			bin.file = filepath.Join(dir, bin.name)
			args := append(append([]string{"build"}, b.flags...), "-o", bin.file, b.pkg)
			cmd := exec.CommandContext(t.Context(), "go", args...)
			cmd.Dir, cmd.Env = root, append(os.Environ(), env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s go %s (as %s builds it): %v\n%s", strings.Join(env, " "), strings.Join(args, " "), images[name].dockerfile, err, out)
			}
			bin.goName, bin.reads = goPackage(t, root, env, b.pkg)
			if bin.goName == "main" {
				bin.flags = helpFlags(t, bin.file)
			}
			bins[b.pkg] = bin
		}
	}
	return bins
}

// goPackage returns a package's name and a test for whether any Go file the binary is
// built from (in this repository or a dependency) names an environment variable, as a
// string literal: a variable nothing names is read by nothing.
func goPackage(t *testing.T, root string, env []string, pkg string) (string, func(string) bool) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-json=Name,ImportPath,Dir,GoFiles", pkg)
	cmd.Dir, cmd.Env = root, append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	var name string
	var files []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Name, ImportPath, Dir string
			GoFiles               []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		for _, f := range p.GoFiles {
			files = append(files, filepath.Join(p.Dir, f))
		}
		name = p.Name // -deps lists the package itself last
	}
	known := map[string]bool{}
	return name, func(v string) bool {
		if found, ok := known[v]; ok {
			return found
		}
		lit := []byte(strconv.Quote(v))
		for _, f := range files {
			if data, err := os.ReadFile(f); err == nil && bytes.Contains(data, lit) {
				known[v] = true
				return true
			}
		}
		known[v] = false
		return false
	}
}

var (
	helpFlagLine = regexp.MustCompile(`^  -(\S+)(?: (\S+))?(?:\t(.*))?$`)
	helpDefault  = regexp.MustCompile(`\(default (.*)\)$`)
)

// helpFlags runs the binary with -help and parses what the flag package prints.
func helpFlags(t *testing.T, bin string) map[string]goFlag {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, "-help")
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -help: %v\n%s", bin, err, out)
	}
	flags := map[string]goFlag{}
	var name string
	var f goFlag
	var usage strings.Builder
	done := func() {
		if name != "" {
			if m := helpDefault.FindStringSubmatch(usage.String()); m != nil {
				f.def = m[1]
				if s, err := strconv.Unquote(m[1]); err == nil {
					f.def = s
				}
			}
			flags[name] = f
		}
		name, f = "", goFlag{}
		usage.Reset()
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if m := helpFlagLine.FindStringSubmatch(line); m != nil {
			done()
			name, f.typ = m[1], m[2]
			usage.WriteString(m[3])
		} else if u, ok := strings.CutPrefix(line, "    \t"); ok && name != "" {
			usage.WriteString(u)
		}
	}
	done()
	if len(flags) == 0 {
		t.Fatalf("%s -help lists no flags:\n%s", bin, out)
	}
	return flags
}

// parseArgs reads command-line arguments as the flag package would, into flag values.
func parseArgs(args []string, flags map[string]goFlag) (map[string]string, error) {
	vals := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			return nil, fmt.Errorf("argument %q: the binary takes no positional arguments", a)
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		f, ok := flags[name]
		if !ok {
			return nil, fmt.Errorf("flag -%s is not in its -help", name)
		}
		if !hasValue {
			if f.typ == "" {
				value = "true"
			} else if i+1 < len(args) {
				i++
				value = args[i]
			} else {
				return nil, fmt.Errorf("flag -%s needs a value", name)
			}
		}
		vals[name] = value
	}
	return vals, nil
}

// ---------------------------------------------------------------------------------------
// .dockerignore

// checkDockerignore requires the build context to hold everything the builds compile
// and nothing git ignores (build outputs, test binaries) or keeps (.git).
func checkDockerignore(t *testing.T, root string, images map[string]*image) {
	rules := dockerignore(t, filepath.Join(root, ".dockerignore"))
	for _, p := range []string{".git", ".git/config"} {
		if !ignored(rules, p) {
			t.Errorf(".dockerignore sends %s", p)
		}
	}
	needed := map[string]string{"go.mod": "the build", "go.sum": "the build"}
	for _, img := range images {
		for _, b := range img.builds {
			cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-json=Dir,GoFiles,EmbedFiles,Module", b.pkg)
			cmd.Dir = root
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list %s: %v", b.pkg, err)
			}
			dec := json.NewDecoder(bytes.NewReader(out))
			for dec.More() {
				var p struct {
					Dir                 string
					GoFiles, EmbedFiles []string
					Module              *struct{ Main bool }
				}
				if err := dec.Decode(&p); err != nil {
					t.Fatal(err)
				}
				if p.Module == nil || !p.Module.Main {
					continue
				}
				for _, f := range slices.Concat(p.GoFiles, p.EmbedFiles) {
					rel, err := filepath.Rel(root, filepath.Join(p.Dir, f))
					if err != nil {
						t.Fatal(err)
					}
					needed[filepath.ToSlash(rel)] = b.pkg
				}
			}
		}
	}
	for _, f := range slices.Sorted(maps.Keys(needed)) {
		if ignored(rules, f) {
			t.Errorf(".dockerignore leaves out %s, which %s needs", f, needed[f])
		}
	}
	// What git ignores in this working tree: build outputs, test binaries.
	cmd := exec.CommandContext(t.Context(), "git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Logf("not checking what git ignores: git ls-files: %v", err)
		return
	}
	for p := range strings.FieldsSeq(string(out)) {
		if p = strings.TrimSuffix(p, "/"); !ignored(rules, p) {
			t.Errorf(".dockerignore sends %s, which git ignores", p)
		}
	}
}

type ignoreRule struct {
	re      *regexp.Regexp
	exclude bool // false for "!" exceptions
}

// dockerignore compiles .dockerignore as Docker does: patterns relative to the context
// root, * and ? within a path element, ** across them, later rules winning.
func dockerignore(t *testing.T, file string) []ignoreRule {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rules []ignoreRule
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{exclude: true}
		if rest, ok := strings.CutPrefix(line, "!"); ok {
			line, r.exclude = strings.TrimSpace(rest), false
		}
		line = strings.TrimPrefix(path.Clean(line), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch ch := line[i]; {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(".*")
				i++
			case ch == '*':
				re.WriteString("[^/]*")
			case ch == '?':
				re.WriteString("[^/]")
			case ch == '[':
				j := strings.IndexByte(line[i:], ']')
				if j < 0 {
					t.Fatalf(".dockerignore: %q: unterminated [", line)
				}
				re.WriteString(line[i : i+j+1])
				i += j
			default:
				re.WriteString(regexp.QuoteMeta(string(ch)))
			}
		}
		re.WriteString("$")
		r.re = regexp.MustCompile(re.String())
		rules = append(rules, r)
	}
	return rules
}

// ignored reports whether the context leaves p out: the last rule matching p or one of
// its parent directories decides.
func ignored(rules []ignoreRule, p string) bool {
	var candidates []string
	for q := p; q != "." && q != "/"; q = path.Dir(q) {
		candidates = append(candidates, q)
	}
	out := false
	for _, r := range rules {
		if slices.ContainsFunc(candidates, r.re.MatchString) {
			out = r.exclude
		}
	}
	return out
}

// ---------------------------------------------------------------------------------------
// The compose services

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
		out  *syncBuffer
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

		r := &running{name: name, out: &syncBuffer{}, done: make(chan error, 1)}
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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
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
