package systemtest

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/test/process"
)

// ExecutorOptions say how to run an executor as a process.
type ExecutorOptions struct {
	// Name names the process and its log, LogDir/Name.log.
	Name, Binary, LogDir string
	// ConfigFile is where Config is written, as YAML, for --config. Config is the
	// tree's config.Config, or a map where an older release must read the file (it
	// reads strictly, and a field it lacks would stop it).
	ConfigFile string
	Config     any
	// Kubeconfig reaches the cluster; Env is added to the environment.
	Kubeconfig string
	Env        []string
}

// Executor is an executor program, not yet started, and where it answers.
type Executor struct {
	*process.Process
	// Readyz and Metrics are its /readyz and /metrics URLs, at the addresses its
	// configuration names.
	Readyz, Metrics string
}

// NewExecutor writes the executor's configuration file and makes the process that reads
// it; Start runs it.
func NewExecutor(o ExecutorOptions) (*Executor, error) {
	raw, err := yaml.Marshal(o.Config)
	if err != nil {
		return nil, fmt.Errorf("executor configuration: %w", err)
	}
	// The addresses as the executor reads them, from the file itself.
	var addrs struct {
		Health        string `json:"healthProbeBindAddress"`
		Metrics       string `json:"metricsBindAddress"`
		MetricsSecure bool   `json:"metricsSecure"`
	}
	if err := yaml.Unmarshal(raw, &addrs); err != nil {
		return nil, fmt.Errorf("executor configuration: %w", err)
	}
	if addrs.Health == "" || addrs.Metrics == "" {
		return nil, fmt.Errorf("executor configuration: healthProbeBindAddress and metricsBindAddress must be set, to know where it answers")
	}
	if err := os.WriteFile(o.ConfigFile, raw, 0o644); err != nil {
		return nil, fmt.Errorf("writing the executor's configuration: %w", err)
	}
	metrics := "http://" + addrs.Metrics + "/metrics"
	if addrs.MetricsSecure {
		metrics = "https://" + addrs.Metrics + "/metrics"
	}
	env := append([]string{"KUBECONFIG=" + o.Kubeconfig}, o.Env...)
	return &Executor{
		Process: process.New(o.Name, o.Binary, o.LogDir, env, "--config", o.ConfigFile),
		Readyz:  "http://" + addrs.Health + "/readyz",
		Metrics: metrics,
	}, nil
}
