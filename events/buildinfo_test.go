package events_test

import (
	"fmt"
	"testing"

	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/test/metricstest"
)

// TestMetricsNameTheBuild: the metrics endpoint says which build serves it.
func TestMetricsNameTheBuild(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	i := buildinfo.Get()
	metricstest.Require(t, inst.Gatherer(),
		fmt.Sprintf(`flyte_events_build_info{version=%q,revision=%q,goversion=%q} 1`, i.Version, i.Commit, i.GoVersion))
}
