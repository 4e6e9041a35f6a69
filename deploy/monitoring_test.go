package deploy_test

// The monitoring component: its alert rules checked and unit-tested by promtool, and its
// objects rendered by kustomize. That every metric the rules name is exported is checked
// against the running programs' /metrics by sandbox's TestSandboxRunsTheExamples.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/deploy/dashboard"
	"github.com/flytekube/backend/test/repo"
)

const monitoringDir = "deploy/kustomize/components/monitoring"

// promtool runs Prometheus's promtool, built from tools/prometheus/go.mod.
func promtool(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", append([]string{"tool", "-modfile=" + filepath.Join(root, "tools", "prometheus", "go.mod"), "promtool"}, args...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestAlertRules: the PrometheusRule's groups pass `promtool check rules` (every query
// parsed by Prometheus's own parser, no duplicate or malformed rule) and every alert's
// unit tests in alerts_test.yaml pass `promtool test rules`.
func TestAlertRules(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, monitoringDir, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string
		Spec struct {
			Groups []struct {
				Name  string           `json:"name"`
				Rules []map[string]any `json:"rules"`
			}
		}
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" || len(rule.Spec.Groups) == 0 {
		t.Fatalf("rules.yaml: kind %q with %d groups; want a PrometheusRule", rule.Kind, len(rule.Spec.Groups))
	}
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(root, monitoringDir, "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, root, "check", "rules", "--lint=all", "--lint-fatal", filepath.Join(dir, "rules.yaml"))
	promtool(t, root, "test", "rules", filepath.Join(dir, "alerts_test.yaml"))

	// Every alert has a test that names it.
	var suite struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
			} `json:"alert_rule_test"`
		}
	}
	if err := yaml.Unmarshal(tests, &suite); err != nil {
		t.Fatal(err)
	}
	var tested []string
	for _, s := range suite.Tests {
		for _, a := range s.AlertRuleTest {
			tested = append(tested, a.Alertname)
		}
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if name, ok := r["alert"].(string); ok && !slices.Contains(tested, name) {
				t.Errorf("alert %s has no test in alerts_test.yaml", name)
			}
		}
	}
}

// TestMonitoringComponentRenders: an overlay of the base with the component renders, with
// a ServiceMonitor for each program's Service, the rules and the dashboard.
func TestMonitoringComponentRenders(t *testing.T) {
	objs := render(t, "deploy/testdata/monitoring")
	monitors, services := map[string]bool{}, map[string]bool{}
	rules, dashboards := 0, 0
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceMonitor":
			monitors[o.GetName()] = true
			if o.GetNamespace() != "flyte" {
				t.Errorf("ServiceMonitor %s in namespace %q; want flyte", o.GetName(), o.GetNamespace())
			}
		case "Service":
			if name := o.GetLabels()["app.kubernetes.io/name"]; name != "" {
				services[name] = true
			}
		case "PrometheusRule":
			rules++
		case "ConfigMap":
			if o.GetName() == "flyte-dashboard" && o.GetLabels()["grafana_dashboard"] == "1" {
				dashboards++
			}
		}
	}
	for _, program := range []string{"executor", "events", "cacheservice"} {
		if !monitors[program] || !services[program] {
			t.Errorf("%s: ServiceMonitor %v, Service %v; want both", program, monitors[program], services[program])
		}
	}
	if rules != 1 || dashboards != 1 {
		t.Errorf("%d PrometheusRules and %d dashboard ConfigMaps; want 1 of each", rules, dashboards)
	}
}

// TestDashboardQueriesParse: every query of the dashboard parses with Prometheus's own
// parser (promtool checks them as recording rules), with Grafana's $__rate_interval
// given a value.
func TestDashboardQueriesParse(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	var rules []map[string]string
	for _, row := range dashboard.Rows {
		for _, p := range row.Panels {
			for _, q := range p.Queries {
				expr := strings.ReplaceAll(q.Expr, "$__rate_interval", "5m")
				rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", len(rules)), "expr": expr})
			}
		}
	}
	if len(rules) < 20 {
		t.Fatalf("%d dashboard queries; want the panels' queries", len(rules))
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, root, "check", "rules", path)
}
