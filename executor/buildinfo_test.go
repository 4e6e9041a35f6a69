package executor_test

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/internal/metricstest"
)

// TestMetricsNameTheBuild: the executor's registry, which its metrics endpoint serves,
// says which build runs.
func TestMetricsNameTheBuild(t *testing.T) {
	registry := prometheus.NewRegistry()
	start(t, testConfig(), env.Namespace(t), runOptions{registry: registry})
	i := buildinfo.Get()
	metricstest.Require(t, registry,
		fmt.Sprintf(`flyte_executor_build_info{version=%q,revision=%q,goversion=%q} 1`, i.Version, i.Commit, i.GoVersion))
}
