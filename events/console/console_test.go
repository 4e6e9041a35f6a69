package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/jaegertest"
	"github.com/flytekube/backend/test/servicetest"
)

// service is an events service with its console, requiring tokens (auth mode
// token-file), on a fresh database.
type service struct {
	// console is the console's URL.
	console string
	// executor records events, as the executor does.
	executor eventsv1connect.EventsServiceClient
	tokens   servicetest.Tokens
}

func startService(t *testing.T, mutate ...func(*events.Config)) *service {
	t.Helper()
	tokens := servicetest.NewTokens(t)
	lis := listen(t)
	cfg := events.Config{
		Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t),
		Auth:            auth.Config{Mode: auth.ModeTokenFile, TokenFile: tokens.File},
		ConsoleListener: lis,
		Server:          server.Config{StreamDrainDelay: 50 * time.Millisecond},
	}
	for _, m := range mutate {
		m(&cfg)
	}
	inst := servicetest.Start(t, func(ctx context.Context, started func(app.Addrs)) error {
		return events.Run(ctx, cfg, slog.New(slog.DiscardHandler), started)
	})
	return &service{
		console:  "http://" + lis.Addr().String() + "/console/",
		executor: eventsv1connect.NewEventsServiceClient(servicetest.WithToken(tokens.Executor), inst.URL, connect.WithGRPC()),
		tokens:   tokens,
	}
}

// page is the console's URL for the view of these query parameters, handing over token.
func (s *service) page(query, token string) string {
	u := s.console
	if query != "" {
		u += "?" + query
	}
	if token != "" {
		u += "#token=" + token
	}
	return u
}

func (s *service) record(t *testing.T, evs ...*eventsv1.ActionEvent) {
	t.Helper()
	if _, err := s.executor.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: evs})); err != nil {
		t.Fatalf("Record: %v", err)
	}
}

func id(run, action string) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: run, Action: action}
}

const (
	queued       = flytecorev1.ActionPhase_ACTION_PHASE_QUEUED
	waiting      = flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES
	initializing = flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING
	running      = flytecorev1.ActionPhase_ACTION_PHASE_RUNNING
	succeeded    = flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED
	failed       = flytecorev1.ActionPhase_ACTION_PHASE_FAILED
)

// timeline builds one action's events: each step is a phase of an attempt at a second
// after start, with what the executor would say of it.
type step struct {
	attempt uint32
	phase   flytecorev1.ActionPhase
	at      int
	reason  string
	edit    func(*eventsv1.ActionEvent)
}

func timeline(start time.Time, action *flytecorev1.ActionIdentifier, steps ...step) []*eventsv1.ActionEvent {
	var out []*eventsv1.ActionEvent
	version := map[uint32]uint32{}
	for _, s := range steps {
		e := &eventsv1.ActionEvent{
			Id: action, Attempt: s.attempt, Phase: s.phase, Version: version[s.attempt],
			OccurredAt: timestamppb.New(start.Add(time.Duration(s.at) * time.Second)),
			Reason:     s.reason, TaskType: "container", Cluster: "sandbox",
		}
		version[s.attempt]++
		if s.edit != nil {
			s.edit(e)
		}
		out = append(out, e)
	}
	return out
}

func userError(code, message string) func(*eventsv1.ActionEvent) {
	return func(e *eventsv1.ActionEvent) {
		e.Error = &flytecorev1.ExecutionError{Kind: flytecorev1.ExecutionError_KIND_USER, Code: code, Message: message}
	}
}

// sample records what the pages show: run nightly-etl (an action from the cache, one
// that failed on its second attempt) and, a minute later, run train-model (one action
// that waited on a cache reservation and one still running).
func sample(t *testing.T, s *service, start time.Time) {
	t.Helper()
	const oom = "container main exited with code 137: OOMKilled"
	s.record(t, timeline(start, id("nightly-etl", "extract"),
		step{1, queued, 0, "Queued", nil},
		step{1, succeeded, 1, "CacheHit", func(e *eventsv1.ActionEvent) {
			e.CacheStatus = flytecorev1.CacheStatus_CACHE_STATUS_HIT
			e.OutputsUri = "file:///tmp/flyte-sandbox/outputs/extract"
		}},
	)...)
	s.record(t, timeline(start, id("nightly-etl", "load"),
		step{1, queued, 1, "Queued", nil},
		step{1, initializing, 2, "Initializing", nil},
		step{1, running, 3, "Running", func(e *eventsv1.ActionEvent) {
			e.LogLinks = []*eventsv1.LogLink{{Name: "pod logs", Uri: "http://127.0.0.1:9/logs/load-1"}}
		}},
		step{2, queued, 10, "Retrying", userError("OOMKilled", oom)},
		step{2, running, 14, "Running", func(e *eventsv1.ActionEvent) {
			e.LogLinks = []*eventsv1.LogLink{{Name: "pod logs", Uri: "http://127.0.0.1:9/logs/load-2"}, {Name: "odd", Uri: "javascript:alert(1)"}}
			e.ClusterEvents = []*eventsv1.ClusterEvent{{
				OccurredAt: timestamppb.New(start.Add(15 * time.Second)), Object: "Pod/load-2", Type: "Warning",
				Reason: "BackOff", Message: "Back-off restarting failed container main", Source: "kubelet", Count: 2,
			}}
		}},
		step{2, failed, 20, "RetriesExhausted", userError("OOMKilled", oom)},
	)...)
	s.record(t, timeline(start, id("train-model", "dedupe"),
		step{1, queued, 60, "WaitingForCache", func(e *eventsv1.ActionEvent) {
			e.Message = "another action holds the cache reservation"
		}},
		step{1, running, 70, "Running", nil},
		step{1, succeeded, 75, "Succeeded", func(e *eventsv1.ActionEvent) {
			e.CacheStatus = flytecorev1.CacheStatus_CACHE_STATUS_POPULATED
		}},
	)...)
	s.record(t, timeline(start, id("train-model", "fit"),
		step{1, queued, 61, "Queued", nil},
		step{1, waiting, 62, "WaitingForResources", nil},
		step{1, running, 66, "Running", nil},
	)...)
}

func TestRunsPageListsRunsAndFollowsTheStream(t *testing.T) {
	s := startService(t)
	start := time.Now().Add(-5 * time.Minute).Truncate(time.Second)
	sample(t, s, start)
	ctx := tab(t)

	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development", s.tokens.Viewer)))
	waitFor(t, ctx, `document.querySelectorAll("#runs tbody tr").length === 2`)
	if got := eval[[]string](t, ctx, `[...document.querySelectorAll("#runs tbody tr")].map(r => r.dataset.run)`); strings.Join(got, ",") != "train-model,nightly-etl" {
		t.Errorf("runs: got %v, want the newest first: train-model, nightly-etl", got)
	}
	counts := eval[string](t, ctx, `document.querySelector('#runs tr[data-run="nightly-etl"] td.counts').innerText`)
	for _, want := range []string{"1 succeeded", "1 failed"} {
		if !strings.Contains(counts, want) {
			t.Errorf("nightly-etl's phase counts %q lack %q", counts, want)
		}
	}
	if hash := eval[string](t, ctx, `location.hash`); hash != "" {
		t.Errorf("the token stayed in the address bar: %q", hash)
	}
	waitFor(t, ctx, `document.getElementById("live").textContent === "live"`)
	screenshot(t, ctx, "runs.png")

	// Recorded while the page is open, shown through the stream: the page is the same
	// document (no reload), and it has a new run and a run whose action moved on.
	eval[bool](t, ctx, `window.notReloaded = true`)
	now := time.Now().Truncate(time.Second)
	s.record(t, timeline(now, id("hourly-report", "report"), step{1, queued, 0, "Queued", nil})...)
	waitFor(t, ctx, `document.querySelector('#runs tr[data-run="hourly-report"]') !== null`)
	s.record(t, timeline(start, id("train-model", "fit"), step{1, succeeded, 200, "Succeeded", nil})...)
	waitFor(t, ctx, `document.querySelector('#runs tr[data-run="train-model"] td.counts').innerText.includes("2 succeeded")`)
	if !eval[bool](t, ctx, `window.notReloaded === true`) {
		t.Error("the page reloaded to show the new events")
	}
	if got := eval[string](t, ctx, `document.querySelector("#runs tbody tr").dataset.run`); got != "hourly-report" {
		t.Errorf("the first run is %q, want the new hourly-report", got)
	}
}

func TestRunPageShowsEachAction(t *testing.T) {
	s := startService(t)
	sample(t, s, time.Now().Add(-5*time.Minute).Truncate(time.Second))
	ctx := tab(t)

	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=nightly-etl", s.tokens.Viewer)))
	waitFor(t, ctx, `document.querySelectorAll("#actions tbody tr").length === 2`)
	cells := func(action string) []string {
		return eval[[]string](t, ctx, fmt.Sprintf(`[...document.querySelectorAll('#actions tr[data-action=%q] td')].map(c => c.innerText.trim())`, action))
	}
	// action, phase, attempts, started, duration, cache, task type, reason or error
	extract, load := cells("extract"), cells("load")
	for _, c := range []struct {
		what      string
		got, want string
	}{
		{"extract's phase", extract[1], "succeeded"},
		{"extract's attempts", extract[2], "1"},
		{"extract's duration", extract[4], "1.0 s"},
		{"extract's cache", extract[5], "hit"},
		{"load's phase", load[1], "failed"},
		{"load's attempts", load[2], "2"},
		{"load's duration", load[4], "19 s"},
		{"load's error", load[7], "user error OOMKilled container main exited with code 137: OOMKilled"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.what, c.got, c.want)
		}
	}
	screenshot(t, ctx, "run.png")

	// The phase filter is a link, and so a deep link.
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=nightly-etl&phase=failed", "")))
	waitFor(t, ctx, `document.querySelectorAll("#actions tbody tr").length === 1`)
	if got := eval[string](t, ctx, `document.querySelector("#actions tbody tr").dataset.action`); got != "load" {
		t.Errorf("filtered on failed: got %q, want load", got)
	}
}

func TestActionPageDrawsEachAttemptsPhasesAndItsError(t *testing.T) {
	jaeger := jaegertest.Start(t)
	s := startService(t, func(c *events.Config) { c.JaegerQueryURL = jaeger.QueryURL() })
	start := time.Now().Add(-5 * time.Minute).Truncate(time.Second)
	sample(t, s, start)
	exportTrace(t, jaeger, "nightly-etl", "load")
	ctx := tab(t)

	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=nightly-etl&action=load", s.tokens.Viewer)))
	waitFor(t, ctx, `document.querySelectorAll("#timeline g.bar").length > 0`)

	type bar struct {
		Attempt    string `json:"attempt"`
		Phase      string `json:"phase"`
		Kind       string `json:"kind"`
		Start, End string
	}
	bars := eval[[]bar](t, ctx, `[...document.querySelectorAll("#timeline g.bar")].map(b => ({attempt: b.dataset.attempt, phase: b.dataset.phase, kind: b.dataset.kind, Start: b.dataset.start, End: b.dataset.end}))`)
	// Times in ms from the first event (1 s after start). A phase ends where the next
	// begins; attempt 1's last ends where attempt 2 begins; the terminal phase is an
	// instant; attempt 2 begins with its backoff wait.
	want := []bar{
		{"1", "queued", "phase", "0", "1000"},
		{"1", "initializing", "phase", "1000", "2000"},
		{"1", "running", "phase", "2000", "9000"},
		{"2", "queued", "backoff", "9000", "13000"},
		{"2", "running", "phase", "13000", "19000"},
		{"2", "failed", "phase", "19000", "19000"},
	}
	if fmt.Sprint(bars) != fmt.Sprint(want) {
		t.Errorf("bars:\n got %v\nwant %v", bars, want)
	}
	if widths := eval[[]float64](t, ctx, `[...document.querySelectorAll("#timeline g.bar rect")].map(r => r.width.baseVal.value)`); len(widths) != len(want) || widths[5] < 3 || widths[2] <= widths[1] {
		t.Errorf("bar widths %v: every bar must be visible, running (7 s) wider than initializing (1 s)", widths)
	}

	errText := eval[string](t, ctx, `document.getElementById("error").innerText`)
	for _, w := range []string{"The action failed", "user error", "OOMKilled", "exited with code 137"} {
		if !strings.Contains(errText, w) {
			t.Errorf("the error box %q lacks %q", errText, w)
		}
	}
	attempts := eval[[]string](t, ctx, `[...document.querySelectorAll("#attempts li")].map(li => li.innerText)`)
	if len(attempts) != 2 || !strings.Contains(attempts[0], "retried after 9.0 s: user error OOMKilled") || !strings.Contains(attempts[1], "failed after 10 s") {
		t.Errorf("attempts: %q", attempts)
	}
	links := eval[[]string](t, ctx, `[...document.querySelectorAll("#attempts a")].map(a => a.href)`)
	if strings.Join(links, " ") != "http://127.0.0.1:9/logs/load-1 http://127.0.0.1:9/logs/load-2" {
		t.Errorf("log links: %v (a javascript: URI must not become a link)", links)
	}
	if got := eval[string](t, ctx, `document.getElementById("cluster-events").innerText`); !strings.Contains(got, "Back-off restarting failed container main") {
		t.Errorf("cluster events: %q", got)
	}
	// Each cluster event names the component that reported it.
	source := eval[[]string](t, ctx, `(() => { const t = document.querySelector("#cluster-events table"), i = [...t.querySelectorAll("th")].findIndex(th => th.textContent === "source"); return [String(i), ...[...t.querySelectorAll("tbody tr")].map(r => i < 0 ? "" : r.cells[i].textContent)]; })()`)
	if len(source) != 2 || source[0] == "-1" || source[1] != "kubelet" {
		t.Errorf("the cluster events' source column: %q; want kubelet", source)
	}
	waitFor(t, ctx, `document.querySelectorAll("#trace g.span").length === 3`)
	if got := eval[int](t, ctx, `document.querySelectorAll("#trace g.span.error").length`); got != 1 {
		t.Errorf("spans drawn as failed: %d, want 1", got)
	}
	screenshot(t, ctx, "action.png")

	// A phase waiting on a cache reservation is shown as such.
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=train-model&action=dedupe", "")))
	waitFor(t, ctx, `document.querySelectorAll("#timeline g.bar").length === 3`)
	if got := eval[string](t, ctx, `document.querySelector("#timeline g.bar").dataset.kind`); got != "cache-wait" {
		t.Errorf("dedupe's first bar is %q, want cache-wait", got)
	}
}

// exportTrace sends Jaeger a trace of the action as the executor's spans name it: a
// reconcile with a cache call and a failed event delivery under it.
func exportTrace(t *testing.T, j *jaegertest.Jaeger, run, action string) {
	t.Helper()
	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLPEndpoint()+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "executor"))))
	tags := map[string]string{"flyte.project": "demo", "flyte.domain": "development", "flyte.run": run, "flyte.action": action}
	var attrs []attribute.KeyValue
	for k, v := range tags {
		attrs = append(attrs, attribute.String(k, v))
	}
	tracer := tp.Tracer("console-test")
	rctx, reconcile := tracer.Start(ctx, "Reconcile")
	reconcile.SetAttributes(attrs...)
	_, get := tracer.Start(rctx, "flyte.cache.v1.CacheService/Get")
	time.Sleep(5 * time.Millisecond)
	get.End()
	_, deliver := tracer.Start(rctx, "events.Deliver")
	deliver.SetStatus(codes.Error, "events service unavailable")
	deliver.End()
	reconcile.End()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := j.WaitForTrace(wctx, "executor", tags); err != nil {
		t.Fatal(err)
	}
}

func TestTokenIsAskedForAndABadOneRefused(t *testing.T) {
	s := startService(t)
	sample(t, s, time.Now().Add(-5*time.Minute).Truncate(time.Second))
	ctx := tab(t)

	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development", "")))
	waitFor(t, ctx, `document.getElementById("token-form") !== null`)
	if got := eval[string](t, ctx, `document.getElementById("token-message").innerText`); !strings.Contains(got, "wants a token") {
		t.Errorf("asking for a token: %q", got)
	}

	do(t, ctx, chromedp.SendKeys("#token", "not-a-token"), chromedp.Click(`#token-form button`))
	waitFor(t, ctx, `document.getElementById("token-message")?.innerText.includes("refused this token")`)
	if got := eval[string](t, ctx, `document.getElementById("token-message").innerText`); !strings.Contains(got, "a valid bearer token is required") {
		t.Errorf("refusing a token: %q", got)
	}
	if got := eval[int](t, ctx, `document.querySelectorAll("#runs tbody tr").length`); got != 0 {
		t.Errorf("a refused token shows %d runs", got)
	}
	screenshot(t, ctx, "token.png")

	// A token of an identity that may not read the project is told so.
	do(t, ctx, chromedp.SetValue("#token", s.tokens.Other), chromedp.Click(`#token-form button`))
	waitFor(t, ctx, `document.querySelector("#notice .error")?.innerText.includes("may not read")`)

	// The viewer's token, brought by a link to a tab holding another, is used once the
	// page has asked; it is kept for the session: the page needs it only once.
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development", s.tokens.Viewer)))
	waitFor(t, ctx, `document.getElementById("token-confirm") !== null`)
	do(t, ctx, chromedp.Click("#token-replace"))
	waitFor(t, ctx, `document.querySelectorAll("#runs tbody tr").length === 2`)
	do(t, ctx, chromedp.Navigate(s.page("project=demo&domain=development&run=train-model", "")))
	waitFor(t, ctx, `document.querySelectorAll("#actions tbody tr").length === 2`)
}
