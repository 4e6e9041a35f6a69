package deploy_test

// The Dockerfiles, checked against the packages they build and the flags those binaries take.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"

	_ "github.com/flytekube/backend/gen/go/flyte/cache/v1"  // the descriptors of the RPCs runCompose calls
	_ "github.com/flytekube/backend/gen/go/flyte/events/v1" // the descriptors of the RPCs runCompose calls
)

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
func checkDockerfiles(t *testing.T, root string, images map[string]*image, bins map[string]*goBinary, oneShots map[string]bool) {
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

		// The binary: ./<binary>/cmd/<binary>, a main package, as the entrypoint; a helper
		// that compose runs once is ./deploy/docker/<binary>, as the health check is.
		want := "./" + img.binary + "/cmd/" + img.binary
		if oneShots[name] {
			want = "./deploy/docker/" + img.binary
		}
		if len(img.entrypoint) == 0 || img.files[img.entrypoint[0]] != want {
			t.Errorf("%s: ENTRYPOINT %q, want the file built from %s", where, img.entrypoint, want)
			continue
		}
		bin := bins[want]
		if bin == nil || bin.goName != "main" {
			t.Errorf("%s: %s is not a main package", where, want)
			continue
		}
		defaults, err := bin.listeners(nil, nil)
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
	flags  map[string]string // flag → its default, for a main package (flagSets)
	reads  func(env string) bool
	// moduleFiles are the files of this repository it is built from, relative to the
	// root: Go sources and embedded files.
	moduleFiles []string
}

// listeners returns the ports the binary listens on, by the flag or setting that says
// so: flags whose default is an address, and the settings of its --config file (cfg, or
// the defaults when nil).
func (b *goBinary) listeners(args map[string]string, cfg *configInfo) (map[int]string, error) {
	out := map[int]string{}
	for name, def := range b.flags {
		if !addrDefault.MatchString(def) {
			continue
		}
		v, ok := args[name]
		if !ok {
			v = def
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
	if cfg == nil && configFiles[b.name] != nil {
		var err error
		if cfg, err = configFiles[b.name]("", nil); err != nil {
			return nil, err
		}
	}
	if cfg != nil {
		maps.Copy(out, cfg.listens)
	}
	return out, nil
}

// buildBinaries builds every package the Dockerfiles build, with their flags and
// environment, and reads the flags each main package registers.
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
			bin.goName, bin.moduleFiles, bin.reads = goPackage(t, root, env, b.pkg)
			if bin.goName == "main" {
				p, err := parseFlags(b.pkg, nil)
				if err != nil {
					t.Fatalf("%s (built by %s): %v", b.pkg, images[name].dockerfile, err)
				}
				bin.flags = p.values
			}
			bins[b.pkg] = bin
		}
	}
	return bins
}

// goPackage loads a package and its dependencies as the build sees them (its
// environment: CGO_ENABLED=0 leaves out cgo files), returning its name, the files of
// this repository the build compiles or embeds (relative to root), and a test for
// whether any Go file it is built from (here or in a dependency) names an environment
// variable as a string literal: a variable nothing names is read by nothing.
func goPackage(t *testing.T, root string, env []string, pkg string) (name string, moduleFiles []string, reads func(string) bool) {
	t.Helper()
	cfg := &packages.Config{
		Context: t.Context(),
		Mode:    packages.NeedName | packages.NeedFiles | packages.NeedEmbedFiles | packages.NeedModule | packages.NeedImports | packages.NeedDeps,
		Dir:     root,
		Env:     append(os.Environ(), env...),
	}
	roots, err := packages.Load(cfg, pkg)
	if err != nil {
		t.Fatalf("loading %s: %v", pkg, err)
	}
	if len(roots) != 1 || packages.PrintErrors(roots) > 0 {
		t.Fatalf("loading %s: %d packages, or errors above", pkg, len(roots))
	}
	var files []string
	packages.Visit(roots, nil, func(p *packages.Package) {
		files = append(files, p.GoFiles...)
		if p.Module == nil || !p.Module.Main {
			return
		}
		for _, f := range slices.Concat(p.GoFiles, p.EmbedFiles) {
			rel, err := filepath.Rel(root, f)
			if err != nil {
				t.Fatal(err)
			}
			moduleFiles = append(moduleFiles, filepath.ToSlash(rel))
		}
	})
	known := map[string]bool{}
	return roots[0].Name, moduleFiles, func(v string) bool {
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
