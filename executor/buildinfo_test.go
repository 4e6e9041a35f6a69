package executor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/metricstest"
)

// TestMetricsNameTheBuild: the executor's registry, which its metrics endpoint serves,
// says which build runs.
func TestMetricsNameTheBuild(t *testing.T) {
	registry := prometheus.NewRegistry()
	start(t, testConfig(), env.Namespace(t), runOptions{registry: registry})
	i := buildinfo.Get()
	want := fmt.Sprintf(`flyte_executor_build_info{version=%q,revision=%q,goversion=%q} 1`, i.Version, i.Commit, i.GoVersion)
	// The registry gathers once the informer's cache has started: before, the actions
	// gauge, which counts the cache, fails the whole gathering.
	eventually.True(t, 30*time.Second, func() bool { return metricstest.Has(t, registry, want) },
		func() string { return "the registry never gathered " + want })
	metricstest.Require(t, registry, want)
}
