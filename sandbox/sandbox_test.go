package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/internal/kubetest"
	"github.com/flytekube/backend/internal/ports"
	"github.com/flytekube/backend/internal/repo"
	"github.com/flytekube/backend/sandbox"
)

func freePort(t *testing.T) int {
	t.Helper()
	p, err := ports.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	return p[0]
}

// TestSandboxRunsTheExamples is `make run` from start to end, as a newcomer gets it:
// every program as its own process, the examples applied, each ending as its file says
// (the sleep and the flaky one succeed, the second echo is a cache hit, the invalid one
// is refused), and everything stopped afterwards.
func TestSandboxRunsTheExamples(t *testing.T) {
	t.Setenv("KUBECONFIG", "") // the embedded control plane, whatever the caller's shell has
	out, scraped := runSandbox(t, "")
	for _, want := range []string{"echo-again: Succeeded", "Hit", "invalid: Rejected", "every example ended as expected", "bufcurl"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	checkMetrics(t, scraped)
}

// TestSandboxUsesTheClusterOfKubeconfig: with KUBECONFIG set, `make run` uses that
// cluster (here a control plane without the CRD, which the sandbox installs).
func TestSandboxUsesTheClusterOfKubeconfig(t *testing.T) {
	env, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	raw, err := env.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := runSandbox(t, kubeconfig)
	if !strings.Contains(out, "using the cluster of "+kubeconfig) || strings.Contains(out, "embedded control plane") {
		t.Errorf("the sandbox did not use the given cluster:\n%s", out)
	}
}

// runSandbox runs the sandbox until the examples settle and returns its output and the
// programs' metrics as they were then.
func runSandbox(t *testing.T, kubeconfig string) (string, map[string]string) {
	t.Helper()
	var out bytes.Buffer
	scraped := map[string]string{}
	o := sandbox.Options{
		Dir: t.TempDir(), Kubeconfig: kubeconfig, UntilSettled: true, Timeout: 2 * time.Minute,
		EventsPort: freePort(t), CachePort: freePort(t), ExecutorHealthPort: freePort(t), ExecutorMetricsPort: freePort(t),
		JaegerQueryPort: freePort(t), JaegerOTLPPort: freePort(t), EventsMetricsPort: freePort(t), CacheMetricsPort: freePort(t),
		Settled: func(ctx context.Context, e sandbox.Endpoints) error {
			for name, url := range map[string]string{"executor": e.ExecutorMetrics, "events": e.EventsMetrics, "cacheservice": e.CacheMetrics} {
				scraped[name] = scrape(t, url)
			}
			return nil
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	err := sandbox.Run(ctx, o, &out)
	t.Log(out.String())
	if err != nil {
		for _, name := range []string{"executor", "events", "cacheservice"} {
			if raw, rerr := os.ReadFile(o.Dir + "/logs/" + name + ".log"); rerr == nil {
				t.Logf("%s.log:\n%s", name, tail(string(raw), 30))
			}
		}
		t.Fatal(err)
	}
	// Everything it started has stopped: nothing answers on its ports any more.
	for _, port := range []int{o.EventsPort, o.CachePort, o.ExecutorHealthPort, o.ExecutorMetricsPort, o.JaegerQueryPort,
		o.JaegerOTLPPort, o.EventsMetricsPort, o.CacheMetricsPort} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			_ = c.Close()
			t.Errorf("port %d still answers after the sandbox stopped", port)
		}
	}
	return out.String(), scraped
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("scraping %s: %v", url, err)
		return ""
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("scraping %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}

// checkMetrics holds the running programs to docs/metrics.md: every metric it documents
// for a program is on that program's /metrics, and the examples moved the counters they
// should have.
func checkMetrics(t *testing.T, scraped map[string]string) {
	t.Helper()
	defer func() {
		if !t.Failed() {
			return
		}
		for program, body := range scraped {
			var names []string
			for _, l := range strings.Split(body, "\n") {
				if f := strings.Fields(l); len(f) > 2 && f[1] == "HELP" {
					names = append(names, f[2])
				}
			}
			t.Logf("%s serves: %s", program, strings.Join(names, " "))
		}
	}()
	path, err := repo.Path("docs", "metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Rows of the tables are "| `name` | program | ...".
	documented := 0
	for _, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		program := strings.TrimSpace(cells[2])
		body, ok := scraped[program]
		if !ok {
			t.Errorf("docs/metrics.md: %s: unknown program %q", name, program)
			continue
		}
		documented++
		if !strings.Contains(body, "# TYPE "+name+" ") {
			t.Errorf("%s's /metrics lacks %s, which docs/metrics.md lists", program, name)
		}
	}
	if documented < 20 {
		t.Errorf("docs/metrics.md lists %d metrics; its tables did not parse", documented)
	}
	for program, series := range map[string][]string{
		"executor": {`flyte_executor_retries_total{kind="user"} 2`, `flyte_executor_cache_lookups_total{result="hit"} 1`,
			`flyte_executor_actions{phase="Succeeded"} 4`, `flyte_executor_cache_puts_total{status="Populated"} 1`},
		"cacheservice": {`flyte_cache_gets_total{result="hit"} 1`, `flyte_cache_reservations_total{result="granted"}`},
		"events":       {`flyte_events_recorded_total`},
	} {
		for _, s := range series {
			if !strings.Contains(scraped[program], s) {
				t.Errorf("%s's /metrics lacks %s", program, s)
			}
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
