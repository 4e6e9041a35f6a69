// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_* environment
// variables and a Prometheus registry that also carries the OpenTelemetry metrics (such
// as the RPC latencies recorded by otelconnect).
//
// Traces are exported over OTLP only when an endpoint is configured
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); otherwise spans are
// still created and trace context still propagates, but nothing leaves the process.
// OTEL_SDK_DISABLED=true turns tracing off. The protocol follows
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL ("grpc" or
// "http/protobuf", the default).
//
// Setup installs its providers globally, one service per process. Tests that run several
// services in one process give each its own tracer provider with WithTracerProvider, so
// that each reports under its own service name.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprometheus "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Registry is a Prometheus registry: where metrics are registered and gathered from.
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// Telemetry holds what Setup installed.
type Telemetry struct {
	// Registry is where the process's Prometheus metrics live; services register their
	// own collectors here.
	Registry Registry
	// Exporting is true when traces leave the process through the provider Setup built
	// from the environment (false when one was given by WithTracerProvider).
	Exporting bool
	// TracerProvider is where the service's spans go: the global provider, or the one
	// given by WithTracerProvider.
	TracerProvider trace.TracerProvider

	shutdown []func(context.Context) error
}

// Option changes what Setup installs.
type Option func(*options)

type options struct {
	tracerProvider trace.TracerProvider
	registry       Registry
}

// WithTracerProvider sends the service's spans to tp, which the caller owns and shuts
// down, instead of a provider built from the OTEL_* variables; the global tracer provider
// is left alone. Tests use it to run several services in one process, each under its own
// service name.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithRegistry puts the OpenTelemetry metrics (such as the RPC latencies of otelconnect)
// in reg, which already has the Go and process collectors, instead of a new registry: a
// process whose /metrics someone else serves (the executor, through controller-runtime)
// gets them there.
func WithRegistry(reg Registry) Option {
	return func(o *options) { o.registry = reg }
}

// Setup installs the global tracer provider, meter provider and propagator for the
// service named serviceName (overridden by OTEL_SERVICE_NAME). WithTracerProvider
// replaces the tracer provider, which is then not installed globally.
func Setup(ctx context.Context, serviceName string, opts ...Option) (*Telemetry, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	t := &Telemetry{Registry: o.registry}
	if t.Registry == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		t.Registry = reg
	}

	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: building resource: %w", err)
	}

	// Trace context crosses every hop even when nothing is exported here, so that a
	// caller's trace continues through this service.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	t.TracerProvider = o.tracerProvider
	if t.TracerProvider == nil {
		exporter, err := traceExporter(ctx)
		if err != nil {
			return nil, err
		}
		if exporter != nil {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
			otel.SetTracerProvider(tp)
			t.shutdown = append(t.shutdown, tp.Shutdown)
			t.Exporting = true
		}
		t.TracerProvider = otel.GetTracerProvider()
	}

	metricExporter, err := otelprometheus.New(otelprometheus.WithRegisterer(t.Registry), otelprometheus.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: creating Prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(metricExporter), sdkmetric.WithResource(res))
	otel.SetMeterProvider(mp)
	t.shutdown = append(t.shutdown, mp.Shutdown)
	return t, nil
}

// traceExporter returns the OTLP exporter the environment asks for, or nil for none.
func traceExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, nil
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exporter sdktrace.SpanExporter
		err      error
	)
	switch protocol {
	case "", "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q is not supported (want grpc or http/protobuf)", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: creating OTLP %s trace exporter: %w", protocol, err)
	}
	return exporter, nil
}

// MetricsHandler serves the registry in the Prometheus exposition format.
func (t *Telemetry) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(t.Registry, promhttp.HandlerOpts{Registry: t.Registry, EnableOpenMetrics: true})
}

// Shutdown flushes pending spans and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}
