package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"
)

// prometheusConfig is the sandbox's Prometheus configuration: the three programs'
// /metrics every 5 s, as the monitoring component's ServiceMonitors scrape them in a
// cluster, and the component's alert rules.
func prometheusConfig(o Options, rules string) map[string]any {
	job := func(name string, port int) map[string]any {
		return map[string]any{"job_name": name, "static_configs": []any{map[string]any{
			"targets": []string{"127.0.0.1:" + strconv.Itoa(port)},
			"labels":  map[string]string{"namespace": "sandbox", "pod": name},
		}}}
	}
	return map[string]any{
		"global":     map[string]any{"scrape_interval": "5s", "evaluation_interval": "5s"},
		"rule_files": []string{rules},
		"scrape_configs": []any{job("executor", o.ExecutorMetricsPort), job("events", o.EventsMetricsPort),
			job("cacheservice", o.CacheMetricsPort)},
	}
}

// startPrometheus writes the configuration and the alert rules (the groups of
// deploy/kustomize/components/monitoring/rules.yaml, a PrometheusRule) and starts bin,
// listening on 127.0.0.1 only, until the sandbox stops.
func startPrometheus(ctx context.Context, root, bin string, o Options, stops *[]func()) error {
	dir := filepath.Join(o.Dir, "prometheus")
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "kustomize", "components", "monitoring", "rules.yaml"))
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	var rule struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		return fmt.Errorf("sandbox: the alert rules: %w", err)
	}
	rules := filepath.Join(dir, "rules.yaml")
	if err := writeYAML(rules, map[string]any{"groups": rule.Spec.Groups}); err != nil {
		return err
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := writeYAML(cfg, prometheusConfig(o, rules)); err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(o.PrometheusPort)
	p, err := startProcess("prometheus", bin, filepath.Join(o.Dir, "logs"), nil, "--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--storage.tsdb.retention.time=1d")
	if err != nil {
		return err
	}
	*stops = append(*stops, stopFunc(p))
	return p.WaitHTTP(ctx, http.DefaultClient, "http://"+addr+"/-/ready", 2*time.Minute)
}
