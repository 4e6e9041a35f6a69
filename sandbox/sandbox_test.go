package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/deploy/dashboard"
	"github.com/flytekube/backend/sandbox"
	"github.com/flytekube/backend/test/chromium"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/nodetest"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/repo"
)

// TestSandboxRunsTheExamples is `make run` from start to end, as a newcomer gets it:
// every program as its own process, the examples applied, each ending as its file says
// (the sleep and the flaky one succeed, the second echo is a cache hit, as is the echo of a
// second cluster, make run CLUSTERS=2, which shares the cache; the invalid one
// is refused; on a real node the container tasks run as pods, one shaped by a PodTemplate
// with a sidecar, one reading a Secret whose value nothing records: checkSecretExample),
// and everything stopped afterwards.
func TestSandboxRunsTheExamples(t *testing.T) {
	t.Setenv("KUBECONFIG", "") // the embedded control plane, whatever the caller's shell has
	out, scraped, calls := runSandbox(t, "", credentials)
	// The second cluster's echo hits the entry the first cluster's computed.
	wants := []string{"echo-again: Succeeded", "Hit", "invalid: Rejected", "echo-second-cluster: Succeeded 1 Hit", "every example ended as expected", "bufcurl",
		"made credentials in " + credentials}
	if nodetest.Unavailable() == "" { // as root, on a real node, the container examples run for real
		wants = append(wants, "container: Succeeded", "container-retry: Succeeded", "container-oom: Failed", "OOMKilled", "secret: Succeeded", "pod-template: Succeeded")
	} else {
		wants = append(wants, "left out, for want of a node")
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	checkMetrics(t, scraped, nodetest.Unavailable() == "")
	checkCloudEvents(t, out)
	// The printed buf curl commands, run as printed, reach the services over TLS with
	// the viewer's token; without the token they are refused.
	if len(calls) != 4 {
		t.Fatalf("ran %d printed bufcurl commands, want 4", len(calls))
	}
	for _, c := range calls {
		if c.err != nil {
			t.Errorf("%s: %v\n%s", c.cmd, c.err, c.out)
		}
		// buf curl reports the refusal of its reflection request in its own words.
		if c.noTokenErr == nil || strings.Contains(c.noTokenOut, "{") {
			t.Errorf("%s without the token: %v\n%s; want it refused", c.cmd, c.noTokenErr, c.noTokenOut)
		}
	}
	if !strings.Contains(calls[0].out, `"actions"`) || !strings.Contains(calls[1].out, `"events"`) || !strings.Contains(calls[2].out, "flyte.cache.v1.CacheService/Get") ||
		!strings.Contains(calls[3].out, `"name": "nats"`) || !strings.Contains(calls[3].out, `"name": "http"`) {
		t.Errorf("the printed commands answered:\n%s\n%s\n%s\n%s", calls[0].out, calls[1].out, calls[2].out, calls[3].out)
	}
}

// checkCloudEvents holds the sandbox to its CloudEvents verdict: both sinks' consumers
// got every event the events service holds (the sandbox fails otherwise), the same
// number each; and the files it printed hold one CloudEvent a line, one per event.
func checkCloudEvents(t *testing.T, out string) {
	t.Helper()
	counts := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^cloudevents: (\w+) got (\d+) events of (\d+) actions, in order, none missing$`).FindAllStringSubmatch(out, -1) {
		counts[m[1]] = m[2] + " events of " + m[3] + " actions"
		if m[2] == "0" {
			t.Errorf("%s: the verdict passed with no events", m[0])
		}
	}
	if len(counts) != 2 || counts["nats"] == "" || counts["nats"] != counts["http"] {
		t.Errorf("the CloudEvents verdict: %v; want a line for nats and one for http, with the same counts", counts)
	}
	files := regexp.MustCompile(`got them: (\S+\.jsonl)`).FindAllStringSubmatch(out, -1)
	if len(files) != 2 {
		t.Errorf("the sandbox printed %d files of received CloudEvents, want 2 (HTTP and NATS)", len(files))
	}
	for _, f := range files {
		raw, err := os.ReadFile(f[1])
		if err != nil {
			t.Error(err)
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		for i, line := range lines {
			var ce struct{ SpecVersion, ID, Type string }
			if err := json.Unmarshal([]byte(line), &ce); err != nil || ce.SpecVersion != "1.0" || !strings.HasPrefix(ce.Type, "org.flyte.action.") {
				t.Errorf("%s line %d is no Flyte CloudEvent: %v: %s", f[1], i+1, err, line)
				break
			}
		}
		if want := strings.Fields(counts["nats"]); len(want) > 0 && fmt.Sprint(len(lines)) != want[0] {
			t.Errorf("%s holds %d events; the verdict counted %s", f[1], len(lines), want[0])
		}
	}
}

// credentials is where both tests keep the services' credentials: the first run makes
// them, the second reuses them, as `make run` does under the cache directory.
var credentials = filepath.Join(os.TempDir(), fmt.Sprintf("flyte-sandbox-test-credentials-%d", os.Getpid()))

func TestMain(m *testing.M) {
	if path := os.Getenv(librariesChild); path != "" {
		os.Exit(librariesChildMain(path))
	}
	// The tests' own clients have nothing to log; without a logger controller-runtime
	// prints a stack trace saying so.
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	_ = os.RemoveAll(credentials)
	os.Exit(code)
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
	// Alone, it makes the credentials; after the other test, it reuses them.
	out, _, calls := runSandbox(t, kubeconfig, credentials)
	if !strings.Contains(out, "using the cluster of "+kubeconfig) || strings.Contains(out, "embedded control plane") {
		t.Errorf("the sandbox did not use the given cluster:\n%s", out)
	}
	if !strings.Contains(out, "credentials in "+credentials) {
		t.Errorf("the sandbox did not say where its credentials are:\n%s", out)
	}
	for _, c := range calls {
		if c.err != nil {
			t.Errorf("%s: %v\n%s", c.cmd, c.err, c.out)
		}
	}
}

// bufCall is one printed bufcurl command, run as printed and without the token.
type bufCall struct {
	cmd, out, noTokenOut string
	err, noTokenErr      error
}

// runPrinted runs, from the repository root, the bufcurl commands the sandbox printed,
// with the alias it printed, and again with an alias that sends no token.
// checkConsole opens the console's printed URL in a real browser, as a newcomer would:
// the runs page must list every run the events service holds for the examples, and
// each action's page must draw its timeline.
func checkConsole(ctx context.Context, t *testing.T, printed string) {
	t.Helper()
	m := regexp.MustCompile(`console: (http://\S+)#token=(\S+)`).FindStringSubmatch(printed)
	if m == nil {
		t.Error("the sandbox printed no console URL with a token")
		return
	}
	page, token := m[1], m[2]
	actions := listActions(ctx, t, page, token)
	if len(actions) == 0 {
		return
	}
	browser, stop, err := chromium.Start()
	if err != nil {
		t.Errorf("the console's browser check: %v (make test installs chromium)", err)
		return
	}
	defer stop()
	tab, cancel := chromedp.NewContext(browser)
	defer cancel()
	tab, cancelTimeout := context.WithTimeout(tab, 2*time.Minute)
	defer cancelTimeout()
	check := func(what, url, done string) bool {
		t.Helper()
		err := chromedp.Do(tab, chromedp.Navigate(url), chromedp.Poll[chromedp.Void](done, chromedp.WithPollingTimeout(30*time.Second)))
		if err != nil {
			body, _ := chromedp.Run(tab, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 2000) : ""`))
			t.Errorf("the console's %s (%s): %v; it shows:\n%s", what, url, err, body)
			return false
		}
		return true
	}
	runs := map[string]bool{}
	for _, a := range actions {
		runs[a.run] = true
	}
	// The printed URL hands the token over; the page keeps it for the session.
	want := make([]string, 0, len(runs))
	for run := range runs {
		want = append(want, fmt.Sprintf("document.querySelector('#runs tr[data-run=%q]') !== null", run))
	}
	if !check("runs page", page+"#token="+token, strings.Join(want, " && ")) {
		return
	}
	base, _, _ := strings.Cut(page, "?")
	for _, a := range actions {
		url := fmt.Sprintf("%s?project=%s&domain=%s&run=%s&action=%s", base, a.project, a.domain, a.run, a.action)
		check("action page of "+a.run+"/"+a.action, url, `document.querySelectorAll("#timeline g.bar").length > 0`)
	}
}

// consoleAction names an action the console lists.
type consoleAction struct{ project, domain, run, action string }

// listActions asks the console's API, as its script does, for the examples' actions.
func listActions(ctx context.Context, t *testing.T, page, token string) []consoleAction {
	t.Helper()
	api := strings.SplitN(page, "/console/", 2)[0] + "/console/api/flyte.events.v1.EventsService/ListActions"
	req, err := http.NewRequestWithContext(ctx, "POST", api, strings.NewReader(`{"project":"demo","domain":"development"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("the console's listing: %v", err)
		return nil
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	var list struct {
		Actions []struct {
			ID struct{ Project, Domain, Run, Action string } `json:"id"`
		}
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &list) != nil {
		t.Errorf("the console's listing: %s: %s", resp.Status, raw)
		return nil
	}
	var out []consoleAction
	for _, a := range list.Actions {
		out = append(out, consoleAction{a.ID.Project, a.ID.Domain, a.ID.Run, a.ID.Action})
	}
	if !slices.ContainsFunc(out, func(a consoleAction) bool { return a.run == "flaky" }) {
		t.Errorf("the console's listing lacks the flaky example: %s", raw)
	}
	return out
}

func runPrinted(ctx context.Context, t *testing.T, printed string) []bufCall {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	var aliases []string
	var cmds []string
	for _, line := range strings.Split(printed, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "alias bufcurl=") || strings.HasPrefix(line, "alias bufcurl-operator="):
			aliases = append(aliases, line)
		case strings.HasPrefix(line, "bufcurl ") || strings.HasPrefix(line, "bufcurl-operator "):
			cmds = append(cmds, line)
		}
	}
	if len(aliases) != 2 {
		t.Errorf("the sandbox printed the aliases %q; want bufcurl and bufcurl-operator", aliases)
		return nil
	}
	alias := strings.Join(aliases, "\n")
	noToken := regexp.MustCompile(` -H "Authorization: Bearer [^"]*\$\(cat "[^"]*"\)"`).ReplaceAllString(alias, "")
	if strings.Count(alias, "Authorization") != 2 || strings.Contains(noToken, "Authorization") {
		t.Errorf("the printed aliases do not each send a bearer token: %s", alias)
	}
	run := func(alias, cmd string) (string, error) {
		// Aliases apply from the line after their definition.
		sh := exec.CommandContext(ctx, "bash", "-c", "shopt -s expand_aliases\n"+alias+"\n"+cmd)
		sh.Dir = root
		out, err := sh.CombinedOutput()
		return string(out), err
	}
	var calls []bufCall
	for _, cmd := range cmds {
		c := bufCall{cmd: cmd}
		c.out, c.err = run(alias, cmd)
		c.noTokenOut, c.noTokenErr = run(noToken, cmd)
		calls = append(calls, c)
	}
	return calls
}

// runSandbox runs the sandbox until the examples settle and returns its output, the
// programs' metrics as they were then, and what its printed bufcurl commands did.
func runSandbox(t *testing.T, kubeconfig, credentials string) (string, map[string]string, []bufCall) {
	t.Helper()
	var out bytes.Buffer
	scraped := map[string]string{}
	var calls []bufCall
	// Found together, so that no two are the same (one at a time, each is free when
	// found but may be handed out twice: the receiver and the events metrics once were).
	p, err := ports.Free(14)
	if err != nil {
		t.Fatal(err)
	}
	o := sandbox.Options{
		Dir: t.TempDir(), Kubeconfig: kubeconfig, UntilSettled: true, Timeout: 2 * time.Minute, CredentialsDir: credentials,
		EventsPort: p[0], CachePort: p[1], ExecutorHealthPort: p[2], ExecutorMetricsPort: p[3],
		JaegerQueryPort: p[4], JaegerOTLPPort: p[5], EventsMetricsPort: p[6], CacheMetricsPort: p[7],
		ConsolePort: p[8], NATSPort: p[9], CloudEventsReceiverPort: p[10], PrometheusPort: p[11],
		SecondCluster: kubeconfig == "", SecondExecutorHealthPort: p[12], SecondExecutorMetricsPort: p[13],
		Settled: func(ctx context.Context, e sandbox.Endpoints) error {
			for name, url := range map[string]string{"executor": e.ExecutorMetrics, "events": e.EventsMetrics, "cacheservice": e.CacheMetrics} {
				scraped[name] = scrape(t, url)
			}
			calls = runPrinted(ctx, t, out.String())
			checkConsole(ctx, t, out.String())
			checkSecretExample(ctx, t, e, out.String())
			checkPrometheus(ctx, t, e.Prometheus)
			return nil
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	err = sandbox.Run(ctx, o, &out)
	t.Log(out.String())
	if err != nil {
		for _, name := range []string{"executor", "events", "cacheservice", "nats-server", "prometheus"} {
			if raw, rerr := os.ReadFile(o.Dir + "/logs/" + name + ".log"); rerr == nil {
				t.Logf("%s.log:\n%s", name, tail(string(raw), 30))
			}
		}
		t.Fatal(err)
	}
	// Everything it started has stopped: nothing answers on its ports any more.
	for _, port := range []int{o.EventsPort, o.CachePort, o.ExecutorHealthPort, o.ExecutorMetricsPort, o.JaegerQueryPort,
		o.JaegerOTLPPort, o.EventsMetricsPort, o.CacheMetricsPort, o.ConsolePort, o.NATSPort, o.CloudEventsReceiverPort,
		o.SecondExecutorHealthPort, o.SecondExecutorMetricsPort} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			_ = c.Close()
			t.Errorf("port %d still answers after the sandbox stopped", port)
		}
	}
	return out.String(), scraped, calls
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

// notInTheSandbox are documented metrics the sandbox cannot show, and why.
var notInTheSandbox = map[string]string{
	"gocloud_dev_blob_latency_milliseconds": "only object stores (s3://, gs://, mem://) go through gocloud.dev/blob; " +
		"the examples' file:// data is read and written through os.Root (datastore.Confine)",
}

// checkMetrics holds the running programs to docs/metrics.md: every metric it documents
// for a program is on that program's /metrics, and the examples moved the counters they
// should have.
func checkMetrics(t *testing.T, scraped map[string]string, withNode bool) {
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
		if why, ok := notInTheSandbox[name]; ok {
			t.Logf("%s: not checked: %s", name, why)
			continue
		}
		if !strings.Contains(body, "# TYPE "+name+" ") {
			t.Errorf("%s's /metrics lacks %s, which docs/metrics.md lists", program, name)
		}
	}
	if documented < 20 {
		t.Errorf("docs/metrics.md lists %d metrics; its tables did not parse", documented)
	}
	// flaky retries twice and four examples succeed; on a real node container-retry
	// retries once more, four more succeed (container, container-retry, secret,
	// pod-template) and container-oom fails.
	userRetries, succeeded, failed := 2, 4, 0
	if withNode {
		userRetries, succeeded, failed = 3, 8, 1
	}
	for program, series := range map[string][]string{
		"executor": {fmt.Sprintf(`flyte_executor_retries_total{kind="user"} %d`, userRetries), `flyte_executor_cache_lookups_total{result="hit"} 1`,
			fmt.Sprintf(`flyte_executor_actions{phase="Succeeded"} %d`, succeeded), fmt.Sprintf(`flyte_executor_actions{phase="Failed"} %d`, failed),
			`flyte_executor_cache_puts_total{status="Populated"} 1`},
		// Two hits: echo-again in the first cluster, echo-second-cluster in the second.
		"cacheservice": {`flyte_cache_gets_total{result="hit"} 2`, `flyte_cache_reservations_total{result="granted"}`},
		"events":       {`flyte_events_recorded_total`, `flyte_events_received_by_cluster_total{cluster="sandbox-2"}`},
	} {
		for _, s := range series {
			if !strings.Contains(scraped[program], s) {
				t.Errorf("%s's /metrics lacks %s", program, s)
			}
		}
	}
	checkAlertMetrics(t, scraped)
}

// checkAlertMetrics holds the alert rules and the dashboard to the running programs:
// every metric a rule or a panel reads is served by one of them (a histogram by its name
// without _bucket, _sum or _count), so that nothing watches a series that cannot exist.
func checkAlertMetrics(t *testing.T, scraped map[string]string) {
	t.Helper()
	path, err := repo.Path("deploy", "kustomize", "components", "monitoring", "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct{ Expr string }
			}
		}
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	readers := map[string][]string{} // metric → the rules and panels that read it
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			for _, m := range metricNames(r.Expr) {
				readers[m] = append(readers[m], "rules.yaml")
			}
		}
	}
	for _, row := range dashboard.Rows {
		for _, p := range row.Panels {
			for _, q := range p.Queries {
				for _, m := range metricNames(q.Expr) {
					readers[m] = append(readers[m], "dashboard panel "+p.Title)
				}
			}
		}
	}
	if len(readers) < 15 {
		t.Fatalf("found %d metrics in the rules and the dashboard; their expressions did not parse", len(readers))
	}
	for _, name := range slices.Sorted(maps.Keys(readers)) {
		served := false
		for _, body := range scraped {
			served = served || strings.Contains(body, "# TYPE "+name+" ")
		}
		if !served {
			t.Errorf("%s read %s, which no program serves", strings.Join(slices.Compact(readers[name]), ", "), name)
		}
	}
}

// metricNames are the metrics a PromQL expression of ours reads: the names left once
// label matchers, ranges, strings and grouping clauses are taken out, and functions and
// keywords passed over; a histogram's series name its family.
func metricNames(expr string) []string {
	expr = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]|"[^"]*"`).ReplaceAllString(expr, " ")
	expr = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`).ReplaceAllString(expr, " ")
	var out []string
	for _, m := range regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`).FindAllString(expr, -1) {
		if strings.HasSuffix(m, "(") {
			continue // a function or an aggregation
		}
		m = strings.TrimSpace(m)
		switch m {
		case "and", "or", "unless", "bool", "offset":
			continue
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			m = strings.TrimSuffix(m, suffix)
		}
		out = append(out, m)
	}
	return out
}

// checkPrometheus holds the sandbox's Prometheus to what make run promises: it scrapes
// the three programs (each target up) and evaluates every alert rule of the monitoring
// component without error.
func checkPrometheus(ctx context.Context, t *testing.T, base string) {
	t.Helper()
	get := func(path string, v any) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		return json.NewDecoder(resp.Body).Decode(v)
	}
	var targets struct {
		Data struct {
			ActiveTargets []struct {
				ScrapePool, Health, LastError string
			}
		}
	}
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct{ Name, Type, Health, LastError string }
			}
		}
	}
	problem := "not asked yet"
	deadline := time.Now().Add(time.Minute)
	for problem != "" && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Second)
		err := get("/api/v1/targets", &targets)
		if err == nil {
			err = get("/api/v1/rules", &rules)
		}
		if err != nil {
			if ctx.Err() == nil {
				problem = err.Error()
			}
			continue
		}
		problem = ""
		up := map[string]bool{}
		for _, tg := range targets.Data.ActiveTargets {
			up[tg.ScrapePool] = tg.Health == "up"
			if tg.Health != "up" {
				problem = fmt.Sprintf("target %s is %s: %s", tg.ScrapePool, tg.Health, tg.LastError)
			}
		}
		if len(up) != 3 {
			problem = fmt.Sprintf("targets %v; want executor, events and cacheservice", up)
		}
		alerts := 0
		for _, g := range rules.Data.Groups {
			for _, r := range g.Rules {
				alerts++
				if r.Health != "ok" {
					problem = fmt.Sprintf("rule %s: health %q (%s)", r.Name, r.Health, r.LastError)
				}
			}
		}
		if alerts < 9 {
			problem = fmt.Sprintf("%d rules loaded; want the monitoring component's", alerts)
		}
	}
	if problem != "" {
		t.Errorf("Prometheus: %s", problem)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
