package jaegertest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/flytekube/backend/test/jaegertest"
)

var jaeger *jaegertest.Jaeger

func TestMain(m *testing.M) { os.Exit(jaegertest.Main(m, &jaeger)) }

// TestExportAndQuery sends a parent and a child span with the OpenTelemetry SDK over each
// OTLP protocol and finds them again through the query API.
func TestExportAndQuery(t *testing.T) {
	for _, tc := range []struct {
		name     string
		exporter func(context.Context) (sdktrace.SpanExporter, error)
	}{
		{"http", func(ctx context.Context) (sdktrace.SpanExporter, error) {
			return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(jaeger.OTLPEndpoint()+"/v1/traces"))
		}},
		{"grpc", func(ctx context.Context) (sdktrace.SpanExporter, error) {
			return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(jaeger.OTLPGRPCEndpoint()), otlptracegrpc.WithInsecure())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			service := "jaegertest-" + tc.name
			run := randomHex(t)
			exp, err := tc.exporter(ctx)
			if err != nil {
				t.Fatalf("creating exporter: %v", err)
			}
			tp := sdktrace.NewTracerProvider(
				sdktrace.WithBatcher(exp),
				sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
			)
			_, parent := tp.Tracer("jaegertest").Start(ctx, "parent", trace.WithAttributes(attribute.String("run", run)))
			_, child := tp.Tracer("jaegertest").Start(trace.ContextWithSpan(ctx, parent), "child",
				trace.WithAttributes(attribute.Int64("attempt", 3), attribute.Bool("cached", true)))
			child.End()
			parent.End()
			// Shutdown flushes the batch to Jaeger.
			if err := tp.Shutdown(ctx); err != nil {
				t.Fatalf("exporting: %v", err)
			}

			got, err := jaeger.WaitForTrace(ctx, service, map[string]string{"run": run})
			if err != nil {
				t.Fatal(err)
			}
			if want := parent.SpanContext().TraceID().String(); got.TraceID != want {
				t.Errorf("trace ID %s, want %s", got.TraceID, want)
			}
			if len(got.Spans) != 2 {
				t.Fatalf("%d spans, want 2: %+v", len(got.Spans), got.Spans)
			}
			p, ok := got.SpanByOperation("parent")
			if !ok {
				t.Fatalf("no span named parent in %+v", got.Spans)
			}
			if v, _ := p.Tag("run"); v != run {
				t.Errorf("parent tag run = %q, want %q", v, run)
			}
			if p.Process == nil || p.Process.ServiceName != service {
				t.Errorf("parent process %+v, want service %s", p.Process, service)
			}
			c, ok := got.SpanByOperation("child")
			if !ok {
				t.Fatalf("no span named child in %+v", got.Spans)
			}
			if v, _ := c.Tag("attempt"); v != "3" {
				t.Errorf("child tag attempt = %q, want 3", v)
			}
			if v, _ := c.Tag("cached"); v != "true" {
				t.Errorf("child tag cached = %q, want true", v)
			}
			if len(c.References) != 1 || c.References[0].RefType != "CHILD_OF" || c.References[0].SpanID != p.SpanID {
				t.Errorf("child references %+v, want CHILD_OF %s", c.References, p.SpanID)
			}

			// The same trace by ID, and the service in the service list.
			byID, err := jaeger.Trace(ctx, got.TraceID)
			if err != nil {
				t.Fatal(err)
			}
			if len(byID.Spans) != 2 {
				t.Errorf("trace by ID has %d spans, want 2", len(byID.Spans))
			}
			services, err := jaeger.Services(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(services, service) {
				t.Errorf("services %v do not include %s", services, service)
			}

			// A tag that no span carries matches nothing.
			none, err := jaeger.Traces(ctx, service, map[string]string{"run": run + "-other"})
			if err != nil {
				t.Fatal(err)
			}
			if len(none) != 0 {
				t.Errorf("search for another run found %d traces", len(none))
			}
		})
	}
}

// TestStart shows the per-test form: a second Jaeger of its own, on other ports.
func TestStart(t *testing.T) {
	j := jaegertest.Start(t)
	if j.QueryURL() == jaeger.QueryURL() || j.OTLPEndpoint() == jaeger.OTLPEndpoint() {
		t.Fatalf("second Jaeger shares an address with the first: %s %s", j.QueryURL(), j.OTLPEndpoint())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	services, err := j.Services(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(services) != 0 {
		t.Errorf("fresh Jaeger knows services %v", services)
	}
}

func randomHex(t *testing.T) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
