package deploy_test

// The Dockerfiles, checked against the packages they build and the flags those binaries take.

import (
	"bytes"
	"flag"
	"fmt"
	"go/version"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"golang.org/x/mod/modfile"
	"golang.org/x/tools/go/packages"
	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"

	"github.com/flytekube/backend/deploy/imagebuild"
)

// image is what a Dockerfile builds, as far as can be told without building it.
type image struct {
	dockerfile string // relative to the repository root
	binary     string // "events", from "events.Dockerfile"
	entrypoint []string
	files      map[string]string // path in the final image → the Go package built there
	builds     []goBuild
	exposed    []int
	stages     []instructions.Stage
}

// goBuild is one `go build` of a RUN instruction.
type goBuild struct {
	stage    string
	env      map[string]string // the assignments before "go" whose values are literal
	flags    []string          // every flag but -o, as -name=value
	trimpath bool
	ldflags  string
	out      string
	pkg      string
	mounts   []*instructions.Mount // the RUN's --mount flags
}

func loadImage(t *testing.T, root, dockerfile string) *image {
	t.Helper()
	where := dockerfile
	f, err := os.Open(filepath.Join(root, dockerfile))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	img := &image{dockerfile: dockerfile, binary: strings.TrimSuffix(path.Base(dockerfile), ".Dockerfile"), files: map[string]string{}}
	img.stages, err = parseDockerfile(f)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if len(img.stages) < 2 {
		t.Fatalf("%s: not a multi-stage build", where)
	}
	stageNames := map[string]bool{}
	for _, s := range img.stages[:len(img.stages)-1] {
		stageNames[s.Name] = true
		for _, c := range s.Commands {
			if run, ok := c.(*instructions.RunCommand); ok {
				builds, err := goBuilds(run)
				if err != nil {
					t.Errorf("%s:%d: %v", where, line(c), err)
				}
				for _, b := range builds {
					b.stage = s.Name
					img.builds = append(img.builds, b)
				}
			}
		}
	}
	for _, c := range img.stages[len(img.stages)-1].Commands {
		switch c := c.(type) {
		case *instructions.CopyCommand:
			if len(c.SourcePaths) != 1 {
				t.Errorf("%s:%d: %s: want one source and one destination", where, line(c), c)
				continue
			}
			src, dst := c.SourcePaths[0], c.DestPath
			if c.From == "" {
				t.Errorf("%s:%d: the final stage copies %s from the build context, not from a build stage", where, line(c), src)
				continue
			}
			if !stageNames[c.From] {
				t.Errorf("%s:%d: COPY --from=%s: no such stage", where, line(c), c.From)
				continue
			}
			for _, b := range img.builds {
				if b.stage == c.From && b.out == src {
					img.files[dst] = b.pkg
				}
			}
			if _, ok := img.files[dst]; !ok {
				t.Errorf("%s:%d: COPY --from=%s %s: no go build in that stage writes it", where, line(c), c.From, src)
			}
		case *instructions.EntrypointCommand:
			if c.PrependShell || len(c.CmdLine) == 0 {
				t.Errorf("%s:%d: %s: want the exec form, a JSON array (there is no shell)", where, line(c), c)
				continue
			}
			img.entrypoint = c.CmdLine
		case *instructions.ExposeCommand:
			for _, p := range c.Ports {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					t.Errorf("%s:%d: EXPOSE %s: want a TCP port number", where, line(c), p)
				}
				img.exposed = append(img.exposed, n)
			}
		}
	}
	return img
}

// finalStage reads the final stage's USER, LABELs and ARG defaults.
func finalStage(img *image) (user string, labels, args map[string]string) {
	labels, args = map[string]string{}, map[string]string{}
	for _, c := range img.stages[len(img.stages)-1].Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				labels[kv.Key] = kv.Value
			}
		case *instructions.ArgCommand:
			for _, kv := range c.Args {
				if kv.Value != nil {
					args[kv.Key] = *kv.Value
				}
			}
		}
	}
	return user, labels, args
}

// parseDockerfile parses a Dockerfile into stages of instructions as BuildKit does, with
// their words expanded as it would with no build arguments given.
func parseDockerfile(r io.Reader) ([]instructions.Stage, error) {
	ast, err := parser.Parse(r)
	if err != nil {
		return nil, err
	}
	stages, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		return nil, err
	}
	lex := shell.NewLex(ast.EscapeToken)
	expander := func(word string) (string, error) {
		out, _, err := lex.ProcessWord(word, shell.EnvsFromSlice(nil))
		return out, err
	}
	for _, s := range stages {
		for _, c := range s.Commands {
			if e, ok := c.(instructions.SupportsSingleWordExpansion); ok {
				if err := e.Expand(expander); err != nil {
					return nil, fmt.Errorf("line %d: %w", line(c), err)
				}
			}
		}
	}
	return stages, nil
}

func line(c instructions.Command) int {
	if loc := c.Location(); len(loc) > 0 {
		return loc[0].Start.Line
	}
	return 0
}

// shellCommand is a simple command of a RUN: its literal variable assignments and its
// words, quotes removed.
type shellCommand struct {
	env  map[string]string
	args []string
}

// shellCommands parses what a RUN runs into its simple commands: the shell form as the
// POSIX shell /bin/sh would, the exec form as one command.
func shellCommands(run *instructions.RunCommand) ([]shellCommand, error) {
	if !run.PrependShell {
		return []shellCommand{{args: run.CmdLine}}, nil
	}
	file, err := syntax.NewParser(syntax.Variant(syntax.LangPOSIX)).Parse(strings.NewReader(strings.Join(run.CmdLine, " ")), "")
	if err != nil {
		return nil, err
	}
	var out []shellCommand
	syntax.Walk(file, func(node syntax.Node) bool {
		switch n := node.(type) {
		case *syntax.Stmt:
			if n.Background {
				err = fmt.Errorf("a background command in %q", run.CmdLine)
			}
		case *syntax.CallExpr:
			c := shellCommand{env: map[string]string{}}
			for _, a := range n.Assigns {
				if a.Value != nil && a.Value.Lit() != "" {
					c.env[a.Name.Value] = a.Value.Lit()
				}
			}
			for _, w := range n.Args {
				s, werr := expand.Literal(nil, w)
				if werr != nil {
					err = werr
				}
				c.args = append(c.args, s)
			}
			out = append(out, c)
		}
		return true
	})
	return out, err
}

// goBuilds finds the `go build` commands of a RUN instruction.
func goBuilds(run *instructions.RunCommand) ([]goBuild, error) {
	cmds, err := shellCommands(run)
	if err != nil {
		return nil, err
	}
	var out []goBuild
	for _, cmd := range cmds {
		if len(cmd.args) < 2 || cmd.args[0] != "go" || cmd.args[1] != "build" {
			continue
		}
		// go build's own flag syntax, for the flags the Dockerfiles use.
		fs := flag.NewFlagSet("go build", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		b := goBuild{env: cmd.env, mounts: instructions.GetMounts(run)}
		fs.StringVar(&b.out, "o", "", "")
		fs.StringVar(&b.ldflags, "ldflags", "", "")
		fs.BoolVar(&b.trimpath, "trimpath", false, "")
		for _, name := range []string{"gcflags", "tags", "mod", "p"} {
			fs.String(name, "", "")
		}
		if err := fs.Parse(cmd.args[2:]); err != nil {
			return nil, fmt.Errorf("go build %q: %w (teach this test the flag)", cmd.args[2:], err)
		}
		fs.Visit(func(f *flag.Flag) {
			if f.Name != "o" {
				b.flags = append(b.flags, "-"+f.Name+"="+f.Value.String())
			}
		})
		if fs.NArg() != 1 || b.out == "" {
			return nil, fmt.Errorf("go build %q: want -o FILE and one package", cmd.args[2:])
		}
		b.pkg = fs.Arg(0)
		out = append(out, b)
	}
	return out, nil
}

// cacheMount reports whether a RUN's mounts hold a cache at target.
func cacheMount(mounts []*instructions.Mount, target string) bool {
	return slices.ContainsFunc(mounts, func(m *instructions.Mount) bool {
		return m.Type == instructions.MountTypeCache && path.Clean(m.Target) == target
	})
}

// runs reports whether a RUN runs the command that starts with args.
func runs(run *instructions.RunCommand, args ...string) bool {
	cmds, err := shellCommands(run)
	return err == nil && slices.ContainsFunc(cmds, func(c shellCommand) bool {
		return len(c.args) >= len(args) && slices.Equal(c.args[:len(args)], args)
	})
}

// checkDockerfiles holds each Dockerfile to what the images promise: built with go.mod's
// Go, statically and reproducibly, with module and build caches; a distroless final
// stage running as non-root the binary of its name, exposing the ports that binary
// listens on by default; and no Dockerfile left unused by compose.
func checkDockerfiles(t *testing.T, root string, images map[string]*image, bins map[string]*goBinary, oneShots map[string]bool) {
	goVersion := goModVersion(t, root)
	used := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(images)) {
		img := images[name]
		where := img.dockerfile
		used[img.dockerfile] = true

		// The build stage.
		var built bool
		for _, s := range img.stages[:len(img.stages)-1] {
			repoName, tag, _ := strings.Cut(s.BaseName, ":")
			if repoName == "golang" && tag != goVersion && !strings.HasPrefix(tag, goVersion+".") && !strings.HasPrefix(tag, goVersion+"-") {
				t.Errorf("%s: stage %s builds with %s, go.mod says go %s", where, s.Name, s.BaseName, goVersion)
			}
			var copiedAll, copiedMod, downloaded bool
			for _, c := range s.Commands {
				switch c := c.(type) {
				case *instructions.CopyCommand:
					copiedAll = copiedAll || (slices.Equal(c.SourcePaths, []string{"."}) && c.DestPath == ".")
					copiedMod = copiedMod || (slices.Contains(c.SourcePaths, "go.mod") && slices.Contains(c.SourcePaths, "go.sum"))
				case *instructions.RunCommand:
					if !runs(c, "go", "mod", "download") {
						continue
					}
					if copiedAll || !copiedMod {
						t.Errorf("%s:%d: go mod download must follow COPY go.mod go.sum and precede COPY . ., so that only they invalidate it", where, line(c))
					}
					if !cacheMount(instructions.GetMounts(c), "/go/pkg/mod") {
						t.Errorf("%s:%d: go mod download without a cache mount on /go/pkg/mod", where, line(c))
					}
					downloaded = true
				}
			}
			if repoName == "golang" {
				built = true
				if !downloaded {
					t.Errorf("%s: stage %s has no go mod download layer", where, s.Name)
				}
			}
		}
		if !built {
			t.Errorf("%s: no golang build stage", where)
		}
		for _, b := range img.builds {
			if b.env["CGO_ENABLED"] != "0" {
				t.Errorf("%s: go build %s without CGO_ENABLED=0: distroless static has no libc", where, b.pkg)
			}
			if !b.trimpath {
				t.Errorf("%s: go build %s without -trimpath", where, b.pkg)
			}
			if ld := strings.Fields(b.ldflags); !slices.Contains(ld, "-s") || !slices.Contains(ld, "-w") {
				t.Errorf("%s: go build %s: -ldflags %q lacks -s -w", where, b.pkg, b.ldflags)
			}
			// The three programs (not the health check) say which release they are,
			// from the build arguments the labels are set from.
			if shipped := slices.ContainsFunc(imagebuild.Programs, func(p imagebuild.Program) bool { return p.Package == b.pkg }); shipped {
				// (The shell's expansion here knows no build arguments: $VERSION is empty.)
				for _, x := range []string{"version=", "commit="} {
					if !strings.Contains(b.ldflags, "-X github.com/flytekube/backend/internal/buildinfo."+x) {
						t.Errorf("%s: go build %s: -ldflags %q does not stamp buildinfo.%s", where, b.pkg, b.ldflags, x)
					}
				}
			}
			for _, cache := range []string{"/go/pkg/mod", "/root/.cache/go-build"} {
				if !cacheMount(b.mounts, cache) {
					t.Errorf("%s: go build %s without a cache mount on %s", where, b.pkg, cache)
				}
			}
		}

		// The final stage.
		final := img.stages[len(img.stages)-1]
		if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") && final.BaseName != "scratch" {
			t.Errorf("%s: the final stage is %s, not distroless static or scratch", where, final.BaseName)
		}
		user, labels, _ := finalStage(img)
		for _, c := range final.Commands {
			if run, ok := c.(*instructions.RunCommand); ok {
				t.Errorf("%s:%d: RUN in the final stage: it has no shell", where, line(run))
			}
		}
		uid, _, _ := strings.Cut(user, ":")
		switch {
		case uid == "" && !strings.HasSuffix(final.BaseName, ":nonroot"):
			t.Errorf("%s: no USER, and %s runs as root", where, final.BaseName)
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

// goModVersion is the language version of go.mod's go line (1.26 of 1.26.0).
func goModVersion(t *testing.T, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.ParseLax("go.mod", data, nil)
	if err != nil || f.Go == nil {
		t.Fatalf("go.mod: no go line (%v)", err)
	}
	return strings.TrimPrefix(version.Lang("go"+f.Go.Version), "go")
}

// ---------------------------------------------------------------------------------------
// The binaries

// goBinary is a binary as a Dockerfile builds it, what it is built from and the flags it
// registers.
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
		if !addrDefault.MatchString(def) && name != rpcListener && !strings.HasSuffix(name, "-listen") {
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
			var env []string // GOOS=$TARGETOS is not literal: this machine's
			for _, k := range slices.Sorted(maps.Keys(b.env)) {
				env = append(env, k+"="+b.env[k])
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
