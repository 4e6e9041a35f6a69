package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/flytekube/backend/executor/tracing"
)

func TestTraceIDIsTheUID(t *testing.T) {
	uid := types.UID("6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b")
	if got := tracing.TraceID(uid).String(); got != "6f1c2a3b4d5e4f608a7b9c0d1e2f3a4b" {
		t.Fatalf("TraceID(%s) = %s; want the UID's hex digits", uid, got)
	}
	for _, same := range []types.UID{"6F1C2A3B-4D5E-4F60-8A7B-9C0D1E2F3A4B", "6f1c2a3b4d5e4f608a7b9c0d1e2f3a4b"} {
		if got := tracing.TraceID(same); got != tracing.TraceID(uid) {
			t.Errorf("TraceID(%s) = %s; want the same trace as %s", same, got, uid)
		}
	}
	sc := tracing.SpanContext(uid)
	if !sc.IsValid() || !sc.IsRemote() || !sc.IsSampled() || sc.TraceID() != tracing.TraceID(uid) {
		t.Fatalf("SpanContext(%s) = %+v; want a valid, remote, sampled parent in the UID's trace", uid, sc)
	}
	if again := tracing.SpanContext(uid); again.SpanID() != sc.SpanID() {
		t.Fatalf("span IDs %s and %s for one UID; want the same every time", sc.SpanID(), again.SpanID())
	}
	// Not UUIDs: hashed, still deterministic and valid.
	for _, odd := range []types.UID{"not-a-uuid", "00000000-0000-0000-0000-000000000000", "6f1c2a3b4d5e4f608a7b9c0d1e2f3a4b00"} {
		id := tracing.TraceID(odd)
		if !id.IsValid() || id != tracing.TraceID(odd) {
			t.Errorf("TraceID(%q) = %s; want a valid, stable ID", odd, id)
		}
	}
	if tracing.SpanContext("").IsValid() {
		t.Error("an action without a UID got a trace")
	}
}

func TestKubernetesSpanName(t *testing.T) {
	for path, want := range map[string]string{
		"/apis/flyte.org/v1/namespaces/ns/taskactions/a0/status": "k8s PUT taskactions/status",
		"/apis/flyte.org/v1/namespaces/ns/taskactions/a0":        "k8s PUT taskactions",
		"/api/v1/namespaces/ns/pods":                             "k8s PUT pods",
		"/api/v1/namespaces/ns":                                  "k8s PUT namespaces",
		"/api/v1/nodes/n1":                                       "k8s PUT nodes",
		"/version":                                               "k8s PUT /version",
	} {
		r := httptest.NewRequest(http.MethodPut, path, nil)
		if got := tracing.KubernetesSpanName(r); got != want {
			t.Errorf("%s: %q; want %q", path, got, want)
		}
	}
}

// TestKubernetesCallsTracedOnlyWithinSpans checks that API calls become child spans of
// the caller's span, and that calls made outside any span (informers, leader election)
// are left alone.
func TestKubernetesCallsTracedOnlyWithinSpans(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cfg := tracing.WrapKubernetes(&rest.Config{Host: srv.URL}, tp)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	call := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/namespaces/ns/pods/p1", nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	call(context.Background())
	ctx, parent := tp.Tracer("test").Start(tracing.ContextWithAction(context.Background(), "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"), "reconcile")
	call(ctx)
	parent.End()

	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		if s.Name() == "k8s GET pods" && (s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindClient) {
			t.Errorf("the API call's span has parent %s, kind %s; want a client span under %s", s.Parent().SpanID(), s.SpanKind(), parent.SpanContext().SpanID())
		}
	}
	if len(names) != 2 || names[0] != "k8s GET pods" {
		t.Fatalf("spans %v; want [k8s GET pods reconcile]: the call outside a span untraced", names)
	}
}

// BenchmarkReconcileSpansTracingOff is what tracing adds to a reconcile when it is off
// (the global provider is a no-op): the action's context, the reconcile span and one
// plugin call's span.
func BenchmarkReconcileSpansTracingOff(b *testing.B) {
	tracer := otel.Tracer(tracing.ScopeName)
	uid := types.UID("6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b")
	b.ReportAllocs()
	for b.Loop() {
		ctx, span := tracer.Start(tracing.ContextWithAction(context.Background(), uid), "TaskAction.Reconcile")
		_, child := tracer.Start(ctx, "plugin.Handle")
		if span.IsRecording() || child.IsRecording() {
			b.Fatal("recording with tracing off")
		}
		child.End()
		span.End()
	}
}
