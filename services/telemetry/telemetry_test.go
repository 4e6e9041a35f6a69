package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/flytekube/backend/services/telemetry"
	"github.com/flytekube/backend/test/metricstest"
)

// otlpReceiver is an OTLP/HTTP trace endpoint that keeps what it receives.
type otlpReceiver struct {
	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var msg coltracepb.ExportTraceServiceRequest
	if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &msg) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.requests = append(r.requests, &msg)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(nil)
}

func clearOTELEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
}

// setup runs telemetry.Setup for one test and shuts it down when the test ends.
func setup(t *testing.T, service string, opts ...telemetry.Option) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.Setup(context.Background(), service, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

// addProbes adds n to an OpenTelemetry counter named name.
func addProbes(t *testing.T, name string, n int64) {
	t.Helper()
	counter, err := otel.Meter("test").Int64Counter(name)
	if err != nil {
		t.Fatal(err)
	}
	counter.Add(context.Background(), n)
}

func TestExportsOverOTLPWhenEndpointSet(t *testing.T) {
	clearOTELEnv(t)
	receiver := &otlpReceiver{}
	srv := httptest.NewServer(receiver)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "renamed-by-env")

	ctx := context.Background()
	tel, err := telemetry.Setup(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	if !tel.Exporting {
		t.Fatal("Exporting = false with an endpoint set")
	}
	_, span := otel.Tracer("test").Start(ctx, "probe-span")
	span.End()
	shutdownCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tel.Shutdown(shutdownCtx); err != nil { // flushes the batch
		t.Fatal(err)
	}

	receiver.mu.Lock()
	defer receiver.mu.Unlock()
	var spans []string
	var service string
	for _, req := range receiver.requests {
		for _, rs := range req.GetResourceSpans() {
			for _, attr := range rs.GetResource().GetAttributes() {
				if attr.GetKey() == "service.name" {
					service = attr.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					spans = append(spans, s.GetName())
				}
			}
		}
	}
	if len(spans) != 1 || spans[0] != "probe-span" {
		t.Fatalf("exported spans %v; want [probe-span]", spans)
	}
	if service != "renamed-by-env" {
		t.Fatalf("service.name = %q; want the OTEL_SERVICE_NAME value", service)
	}
}

func TestSetupChoices(t *testing.T) {
	tests := []struct {
		name          string
		env           map[string]string
		wantExporting bool
		wantErr       string
	}{
		{name: "no endpoint exports nothing"},
		{name: "disabled wins over an endpoint", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}},
		{name: "grpc protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantExporting: true},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, wantErr: "carrier-pigeon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearOTELEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			tel, err := telemetry.Setup(context.Background(), "events")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Setup error %v; want one naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tel.Shutdown(context.Background()) }()
			if tel.Exporting != tt.wantExporting {
				t.Fatalf("Exporting = %v; want %v", tel.Exporting, tt.wantExporting)
			}
		})
	}
}

func TestMetricsHandlerServesPrometheusAndOpenTelemetryMetrics(t *testing.T) {
	clearOTELEnv(t)
	tel := setup(t, "events")
	addProbes(t, "flyte_test_probes", 3)

	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	scrape := metricstest.Scrape(srv.URL)
	if n, err := testutil.GatherAndCount(scrape, "go_goroutines", "process_cpu_seconds_total"); err != nil || n != 2 {
		t.Errorf("/metrics has %d series of go_goroutines and process_cpu_seconds_total (%v); want one each", n, err)
	}
	metricstest.Require(t, scrape, "flyte_test_probes_total 3")
}

// TestInjectedTracerProviderLeavesTheGlobalAlone runs Setup as an in-process test of
// several services does: the service's spans go to its own provider, even with an
// endpoint in the environment, and the global provider stays as it was.
func TestInjectedTracerProviderLeavesTheGlobalAlone(t *testing.T) {
	clearOTELEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // would be used without the option
	before := otel.GetTracerProvider()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tel := setup(t, "events", telemetry.WithTracerProvider(tp))
	if tel.TracerProvider != tp || tel.Exporting {
		t.Fatalf("TracerProvider %v, Exporting %v; want the injected provider, not exporting by itself", tel.TracerProvider, tel.Exporting)
	}
	if otel.GetTracerProvider() != before {
		t.Fatal("Setup replaced the global tracer provider")
	}
	_, span := tel.TracerProvider.Tracer("test").Start(context.Background(), "probe-span")
	span.End()
	if len(rec.Ended()) != 1 {
		t.Fatalf("the injected provider recorded %d spans; want 1", len(rec.Ended()))
	}
}

// TestWithRegistryAddsToAnExistingRegistry is the executor's case: controller-runtime's
// registry, which has the Go and process collectors already, gets the OpenTelemetry
// metrics too.
func TestWithRegistryAddsToAnExistingRegistry(t *testing.T) {
	clearOTELEnv(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	setup(t, "executor", telemetry.WithRegistry(reg))
	addProbes(t, "flyte_test_registry_probes", 2)
	if n, err := testutil.GatherAndCount(reg, "go_goroutines", "flyte_test_registry_probes_total"); err != nil || n != 2 {
		t.Errorf("the registry has %d series of go_goroutines and flyte_test_registry_probes_total (%v); want one each", n, err)
	}
}
