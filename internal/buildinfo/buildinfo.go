// Package buildinfo says which build of the project a binary is: its version and commit.
// `make build` and the image builds set both at link time (LDFlags); otherwise they come
// from the stamp the Go toolchain puts in a binary built inside a git checkout
// (vcs.revision, vcs.modified), so that a plain `go build` or `go run` still names its
// commit. As Kubernetes' version.Info and Prometheus's build_info, a binary prints it for
// --version (Flag) and serves it as a gauge of value 1 (Metric).
package buildinfo

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Set at link time: -ldflags "-X <Package>.version=v0.2.0 -X <Package>.commit=<sha>".
var (
	version string
	commit  string
)

// Package is this package's import path, which -X names.
const Package = "github.com/flytekube/backend/internal/buildinfo"

const (
	// Devel is the version of a build that was given none and whose module has none.
	Devel = "devel"
	// Unknown is the commit of a build made outside git or with -buildvcs=false.
	Unknown = "unknown"
)

// Info is what a build is.
type Info struct {
	// Version is `git describe --tags --match 'v*' --always --dirty` at build time
	// (v0.2.0, v0.2.0-3-g936b0fa, v0.2.0-dirty), else Devel. Not the pseudo-version the
	// toolchain derives from the tags (v0.1.1-0.20261205031747-004474a24d72 after v0.1.0),
	// which a dashboard grouping by version would read as a release.
	Version string
	// Commit is the full commit hash, with "-dirty" when the toolchain saw a modified
	// tree, or Unknown.
	Commit string
	// GoVersion is the Go release the binary was built with; Platform is GOOS/GOARCH.
	GoVersion, Platform string
}

// LDFlags are the -ldflags that stamp version and commit into a binary.
func LDFlags(version, commit string) string {
	return fmt.Sprintf("-X %s.version=%s -X %s.commit=%s", Package, version, Package, commit)
}

// Get is the running binary's Info.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return resolve(version, commit, bi)
}

// resolve prefers what was set at link time, then the toolchain's stamp of the commit in
// bi (nil when the binary has none).
func resolve(ldVersion, ldCommit string, bi *debug.BuildInfo) Info {
	i := Info{Version: ldVersion, Commit: ldCommit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if bi.GoVersion != "" {
			i.GoVersion = bi.GoVersion
		}
		if i.Commit == "" {
			var revision string
			var modified bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					revision = s.Value
				case "vcs.modified":
					modified, _ = strconv.ParseBool(s.Value)
				}
			}
			if revision != "" && modified {
				revision += "-dirty"
			}
			i.Commit = revision
		}
	}
	if i.Version == "" {
		i.Version = Devel
	}
	if i.Commit == "" {
		i.Commit = Unknown
	}
	return i
}

// Line is what --version prints for program: one line.
func (i Info) Line(program string) string {
	return fmt.Sprintf("%s %s (commit %s, %s %s)", program, i.Version, i.Commit, i.GoVersion, i.Platform)
}

// Flag registers --version on fs: when given, program's Line is printed and the process
// exits 0 at once, while the command line is parsed, before any other flag or setting is
// checked, so that it works without configuration.
func Flag(fs *flag.FlagSet, program string) {
	fs.BoolFunc("version", "print the version and exit", func(v string) error {
		if on, err := strconv.ParseBool(v); err != nil || !on {
			return err
		}
		fmt.Println(Get().Line(program))
		os.Exit(0)
		return nil
	})
}

// Metric is the gauge name (flyte_executor_build_info and so on) of value 1 whose labels
// say the running build: version, revision (the commit) and goversion, as Prometheus's
// own build_info. Join it to other series to see which build served them.
func Metric(name string) prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name,
		Help:        "A metric with a constant '1' value labeled by the version, revision (commit) and Go version of the build.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Commit, "goversion": i.GoVersion}})
	g.Set(1)
	return g
}

// Describe is the version and commit of the checkout at dir, as make stamps them
// (VERSION and COMMIT in the Makefile), for builders written in Go; Devel and Unknown
// outside git.
func Describe(ctx context.Context, dir string) (version, commit string) {
	run := func(args ...string) string {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(out))
	}
	version, commit = run("describe", "--tags", "--match", "v*", "--always", "--dirty"), run("rev-parse", "HEAD")
	if version == "" {
		version = Devel
	}
	if commit == "" {
		commit = Unknown
	}
	return version, commit
}
