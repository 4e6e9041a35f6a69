package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/jaegertest"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

var kube *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &kube, kubetest.Options{TaskActions: true})) }

// tracerProvider exports one service's spans to Jaeger under its own service name: the
// three services share this process, so none of them may use the global provider.
func tracerProvider(t *testing.T, j *jaegertest.Jaeger, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(j.OTLPEndpoint()+"/v1/traces"))
	if err != nil {
		t.Fatalf("creating the OTLP exporter of %s: %v", service, err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(200*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// TestOneTracePerAction runs a cached action through the executor, which consults the
// cache service and reports to the events service, and finds every hop in Jaeger as one
// trace: the action's, whose ID is its UID.
func TestOneTracePerAction(t *testing.T) {
	// The services' telemetry must not pick up an exporter from the environment.
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	jaeger := jaegertest.Start(t)
	pg := pgtest.New(t)
	log := slog.New(slog.DiscardHandler)

	providers := map[string]*sdktrace.TracerProvider{}
	for _, s := range []string{"executor", "events", "cacheservice"} {
		providers[s] = tracerProvider(t, jaeger, s)
	}
	eventsSvc := servicetest.Run(t, events.Run, events.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t),
		TracerProvider: providers["events"], Auth: auth.Config{Mode: auth.ModeNone}})
	cacheSvc := servicetest.Run(t, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t),
		TracerProvider: providers["cacheservice"], Auth: auth.Config{Mode: auth.ModeNone}})

	ns := kubetest.ProjectNamespace(t, kube.Client, "e2e") // the project its actions name
	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.GC.Interval = metav1.Duration{}
	cfg.EventsServiceURL, cfg.CacheServiceURL = eventsSvc.URL, cacheSvc.URL
	cfg.Storage.AllowedPrefixes = []string{"file://" + filepath.Dir(t.TempDir())} // the test's temporary directories
	cfg.Namespaces = []string{ns}
	delivered := make(chan *flytev1.TaskAction, 1)
	_, stop := kubetest.RunManager(t, func(ctx context.Context) (manager.Manager, error) {
		return executor.Setup(ctx, cfg, kube.Config, log, executor.Options{
			SkipNameValidation: true, MetricsRegistry: prometheus.NewRegistry(), TracerProvider: providers["executor"],
			OnDelivered: func(ta *flytev1.TaskAction) { delivered <- ta },
		})
	})

	dir := t.TempDir()
	inputs := filepath.Join(dir, "inputs.json")
	if err := os.WriteFile(inputs, []byte(`{"x": 42}`), 0o644); err != nil {
		t.Fatal(err)
	}
	name := "traced-" + ns[len(ns)-6:] // unique, so that Jaeger's tag search finds this one only
	ta := &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "e2e", Domain: "development", RunName: "run-" + name, ActionName: name,
			TaskName: "e2e.echo-" + ns, TaskType: "core-echo", InputURI: "file://" + inputs, RunOutputBase: "file://" + dir,
			Cache: &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true}},
	}
	if err := kube.Client.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	var got *flytev1.TaskAction
	select {
	case got = <-delivered:
	case <-time.After(time.Minute):
		t.Fatal("the action did not finish with its events delivered")
	}
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.CacheStatus != flytev1.CachePopulated {
		t.Fatalf("the action ended %s with cache status %s; want Succeeded, Populated", got.Status.Phase, got.Status.CacheStatus)
	}
	stop() // its last reconciles are over; what remains is in the exporters' batches
	for s, tp := range providers {
		if err := tp.ForceFlush(context.Background()); err != nil {
			t.Fatalf("flushing the spans of %s: %v", s, err)
		}
	}

	// The trace ID is the UID's 16 bytes: found by a tag search, or pasted from kubectl.
	wantID := strings.ReplaceAll(string(got.UID), "-", "")
	qctx, qcancel := context.WithTimeout(context.Background(), time.Minute)
	defer qcancel()
	byAction := map[string]string{"flyte.action": name}
	if _, err := jaeger.WaitForTrace(qctx, "executor", byAction); err != nil {
		t.Fatal(err)
	}

	// Spans reach Jaeger's storage in batches: look until the whole trace is there, every
	// 250 ms (a query reads the whole trace).
	var (
		trace    jaegertest.Trace
		missing  = []string{"the trace"}
		queryErr error
	)
	if wait.PollUntilContextCancel(qctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var tr jaegertest.Trace
		if tr, queryErr = jaeger.Trace(ctx, wantID); queryErr == nil {
			trace, missing = tr, checkTrace(tr, got)
		}
		return queryErr == nil && len(missing) == 0, nil
	}) != nil {
		t.Fatalf("trace %s (last error: %v) lacks:\n  %s\nit holds:\n%s", wantID, queryErr, strings.Join(missing, "\n  "), describe(trace))
	}
	// Every span naming the action is in that one trace.
	traces, err := jaeger.Traces(qctx, "executor", byAction)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range traces {
		if tr.TraceID != wantID {
			t.Errorf("trace %s also has spans of the action; want them all in %s, from its UID %s:\n%s", tr.TraceID, wantID, got.UID, describe(tr))
		}
	}
	if testing.Verbose() {
		t.Logf("trace %s:\n%s", wantID, describe(trace))
	}
}

// checkTrace lists what the action's trace lacks.
func checkTrace(tr jaegertest.Trace, ta *flytev1.TaskAction) []string {
	byID := map[string]jaegertest.Span{}
	for _, s := range tr.Spans {
		byID[s.SpanID] = s
	}
	service := func(s jaegertest.Span) string {
		if s.Process == nil {
			return ""
		}
		return s.Process.ServiceName
	}
	parent := func(s jaegertest.Span) (jaegertest.Span, bool) {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" && r.TraceID == tr.TraceID {
				p, ok := byID[r.SpanID]
				return p, ok
			}
		}
		return jaegertest.Span{}, false
	}
	find := func(svc string, ok func(jaegertest.Span) bool) []jaegertest.Span {
		var out []jaegertest.Span
		for _, s := range tr.Spans {
			if service(s) == svc && ok(s) {
				out = append(out, s)
			}
		}
		return out
	}
	named := func(op string) func(jaegertest.Span) bool {
		return func(s jaegertest.Span) bool { return s.OperationName == op }
	}
	childOf := func(s jaegertest.Span, svc, op string) bool {
		p, ok := parent(s)
		return ok && service(p) == svc && (op == "" || p.OperationName == op)
	}

	var missing []string
	want := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}

	reconciles := find("executor", named("TaskAction.Reconcile"))
	// A cached core-echo runs to its end in one pass; the delivery of its events, started
	// apart from it, joins the same trace (checked below).
	want(len(reconciles) >= 1, fmt.Sprintf("an executor reconcile span (has %d)", len(reconciles)))
	tags := map[string]string{
		"flyte.project": ta.Spec.Project, "flyte.domain": ta.Spec.Domain, "flyte.run": ta.Spec.RunName,
		"flyte.action": ta.Spec.ActionName, "flyte.attempt": "1", "k8s.namespace.name": ta.Namespace,
		"flyte.task_action": ta.Name, "flyte.task_type": ta.Spec.TaskType,
	}
	for _, r := range reconciles {
		for k, v := range tags {
			if got, _ := r.Tag(k); got != v {
				missing = append(missing, fmt.Sprintf("tag %s=%s on reconcile span %s (has %q)", k, v, r.SpanID, got))
			}
		}
	}
	want(slices.ContainsFunc(reconciles, func(s jaegertest.Span) bool { p, _ := s.Tag("flyte.phase"); return p == "Succeeded" }),
		"a reconcile span with flyte.phase=Succeeded")

	want(len(find("executor", func(s jaegertest.Span) bool {
		id, _ := s.Tag("flyte.plugin")
		return s.OperationName == "plugin.Handle" && id == "core-echo" && childOf(s, "executor", "TaskAction.Reconcile")
	})) > 0, "an executor plugin.Handle span (flyte.plugin=core-echo) under a reconcile")

	want(len(find("executor", func(s jaegertest.Span) bool {
		return strings.HasPrefix(s.OperationName, "k8s ") && childOf(s, "executor", "")
	})) > 0, "an executor Kubernetes API span (k8s ...) under another executor span")

	// A serializable action looks up and reserves in one call, and stores and releases in one.
	for _, rpc := range []string{"flyte.cache.v1.CacheService/LookupOrReserve", "flyte.cache.v1.CacheService/PutAndRelease"} {
		want(len(find("executor", named(rpc))) > 0, "an executor client span "+rpc)
		want(len(find("cacheservice", func(s jaegertest.Span) bool {
			return s.OperationName == rpc && childOf(s, "executor", rpc)
		})) > 0, "a cacheservice handler span "+rpc+" under the executor's call")
	}

	want(len(find("executor", named("events.Deliver"))) > 0, "an executor events.Deliver span")
	want(len(find("events", func(s jaegertest.Span) bool {
		return s.OperationName == "flyte.events.v1.EventsService/Record" && childOf(s, "executor", "flyte.events.v1.EventsService/Record")
	})) > 0, "an events handler span Record under the executor's call")

	isSQL := func(s jaegertest.Span) bool { v, _ := s.Tag("db.system.name"); return v == "postgresql" }
	want(len(find("events", isSQL))+len(find("cacheservice", isSQL)) > 0, "a SQL span of the events or cache service")
	return missing
}

// describe prints a trace's spans, one a line, for failure messages.
func describe(tr jaegertest.Trace) string {
	var b strings.Builder
	for _, s := range tr.Spans {
		svc, parent := "?", "-"
		if s.Process != nil {
			svc = s.Process.ServiceName
		}
		for _, r := range s.References {
			parent = r.RefType + ":" + r.SpanID
		}
		fmt.Fprintf(&b, "  %-12s %-45s span %s parent %s\n", svc, s.OperationName, s.SpanID, parent)
	}
	return b.String()
}
