package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/test/metricstest"
)

func TestResolve(t *testing.T) {
	stamped := func(settings ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/flytekube/backend", Version: "(devel)"}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi
	}
	const sha = "5a96befc044bdc7026488447c4bb1c80ec6190dc"
	tests := []struct {
		name                  string
		ldVersion, ldCommit   string
		bi                    *debug.BuildInfo
		wantVersion, wantComm string
	}{
		{"set at link time wins over the toolchain's stamp", "v0.2.0", sha, stamped("vcs.revision", "0000000", "vcs.modified", "true"), "v0.2.0", sha},
		{"a plain go build names its commit", "", "", stamped("vcs.revision", sha, "vcs.modified", "false"), Devel, sha},
		{"a modified tree says so", "", "", stamped("vcs.revision", sha, "vcs.modified", "true"), Devel, sha + "-dirty"},
		{"not the pseudo-version the toolchain derives from a tag, which reads as a release", "", "", func() *debug.BuildInfo {
			bi := stamped("vcs.revision", sha)
			bi.Main.Version = "v0.1.1-0.20261205020000-5a96befc044b"
			return bi
		}(), Devel, sha},
		{"no stamp at all (go test, -buildvcs=false)", "", "", stamped(), Devel, Unknown},
		{"no build information", "", "", nil, Devel, Unknown},
		{"only the version at link time", "v0.2.0", "", stamped("vcs.revision", sha), "v0.2.0", sha},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.ldVersion, tc.ldCommit, tc.bi)
			if got.Version != tc.wantVersion || got.Commit != tc.wantComm {
				t.Errorf("version %q commit %q; want %q and %q", got.Version, got.Commit, tc.wantVersion, tc.wantComm)
			}
			if got.GoVersion == "" || got.Platform == "" {
				t.Errorf("no Go version or platform: %+v", got)
			}
		})
	}
}

func TestLine(t *testing.T) {
	i := Info{Version: "v0.2.0", Commit: "abc", GoVersion: "go1.26.8", Platform: "linux/amd64"}
	got := i.Line("events")
	if want := "events v0.2.0 (commit abc, go1.26.8 linux/amd64)"; got != want {
		t.Errorf("%q; want %q", got, want)
	}
	if strings.Contains(got, "\n") {
		t.Errorf("%q is more than one line", got)
	}
}

func TestMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(Metric("flyte_test_build_info")); err != nil {
		t.Fatal(err)
	}
	i := Get()
	metricstest.Require(t, reg, `flyte_test_build_info{version="`+i.Version+`",revision="`+i.Commit+`",goversion="`+i.GoVersion+`"} 1`)
}
