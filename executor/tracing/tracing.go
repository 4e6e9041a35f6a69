// Package tracing puts everything the executor does for one TaskAction in one trace: every
// reconcile, and under each its plugin calls, Kubernetes API calls and cache RPCs, which
// carry the trace on into the cache service; event deliveries join it too (see
// eventsink).
//
// An action's trace ID is its UID: a UUID is 16 bytes, as a trace ID is. So every
// reconcile of the action, in any replica and across restarts, lands in the same trace
// without the executor storing anything, and a person gets from an action to its trace
// with `kubectl get taskaction NAME -o jsonpath={.metadata.uid}`, dashes removed. Each
// reconcile span is the child of a synthetic remote parent with that trace ID and a span
// ID derived from the UID too; that parent is never exported, so tracing back ends show
// the reconciles as the trace's top spans (Jaeger adds a warning about the unknown
// parent).
//
// With tracing off (the default no-op tracer provider) spans are not recorded and the
// wrappers here pass calls straight through.
package tracing

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"github.com/google/uuid"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// ScopeName names the executor's tracer.
const ScopeName = "github.com/flytekube/backend/executor"

// The attributes that find an action's spans by its names.
const (
	Project    = attribute.Key("flyte.project")
	Domain     = attribute.Key("flyte.domain")
	Run        = attribute.Key("flyte.run")
	Action     = attribute.Key("flyte.action")
	Attempt    = attribute.Key("flyte.attempt")
	Namespace  = attribute.Key("k8s.namespace.name")
	TaskAction = attribute.Key("flyte.task_action")
	TaskType   = attribute.Key("flyte.task_type")
	// Phase is the phase an action reached in a reconcile.
	Phase = attribute.Key("flyte.phase")
	// Plugin is the ID of the plugin called.
	Plugin = attribute.Key("flyte.plugin")
)

// ActionAttributes are the attributes naming an action, its attempt and its phase.
func ActionAttributes(ta *flytev1.TaskAction) []attribute.KeyValue {
	return []attribute.KeyValue{
		Project.String(ta.Spec.Project), Domain.String(ta.Spec.Domain), Run.String(ta.Spec.RunName),
		Action.String(ta.Spec.ActionName), Attempt.Int(int(max(ta.Status.Attempts, 1))),
		Namespace.String(ta.Namespace), TaskAction.String(ta.Name), TaskType.String(ta.Spec.TaskType),
		Phase.String(string(ta.Status.Phase)),
	}
}

// TraceID is the trace of the action with this UID: the UUID's 16 bytes. A UID that is
// not a UUID (Kubernetes makes UUIDs; tests may not) is hashed instead.
func TraceID(uid types.UID) trace.TraceID {
	u, err := uuid.Parse(string(uid))
	if id := trace.TraceID(u); err == nil && id.IsValid() {
		return id
	}
	sum := sha256.Sum256([]byte(uid))
	return trace.TraceID(sum[:16])
}

// SpanContext is the synthetic parent of the action's spans: its trace, and a span ID
// folded from the UID (the two halves of the trace ID XORed). It is marked sampled, so a
// parent-based sampler keeps every action; a trace-ID ratio sampler keeps a consistent
// fraction of actions, since one action is one trace ID.
func SpanContext(uid types.UID) trace.SpanContext {
	if uid == "" {
		return trace.SpanContext{}
	}
	tid := TraceID(uid)
	var sid trace.SpanID
	for i := range sid {
		sid[i] = tid[i] ^ tid[i+len(sid)]
	}
	if !sid.IsValid() {
		sid[len(sid)-1] = 1
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// ContextWithAction makes spans started from ctx join the action's trace.
func ContextWithAction(ctx context.Context, uid types.UID) context.Context {
	sc := SpanContext(uid)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// ConnectOption traces a Connect client's calls to tp (the global provider when nil) and
// passes the trace context on to the service, with the global propagator.
func ConnectOption(tp trace.TracerProvider) (connect.ClientOption, error) {
	var opts []otelconnect.Option
	if tp != nil {
		opts = append(opts, otelconnect.WithTracerProvider(tp))
	}
	i, err := otelconnect.NewInterceptor(opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: creating the Connect interceptor: %w", err)
	}
	return connect.WithInterceptors(i), nil
}

// WrapKubernetes returns a copy of cfg whose requests are traced to tp (the global
// provider when nil), as children of the caller's span. Only requests made within a
// recording span are traced: informers' lists and watches and leader election would
// otherwise each start a trace of their own, and with tracing off nothing is added to
// any request. client-go keeps its own request metrics, so otelhttp records none.
func WrapKubernetes(cfg *rest.Config, tp trace.TracerProvider) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	opts := []otelhttp.Option{
		otelhttp.WithFilter(func(r *http.Request) bool { return trace.SpanFromContext(r.Context()).IsRecording() }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return KubernetesSpanName(r) }),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
	}
	if tp != nil {
		opts = append(opts, otelhttp.WithTracerProvider(tp))
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return otelhttp.NewTransport(rt, opts...) })
	return cfg
}

// KubernetesSpanName names an API call by its method and resource, leaving out object
// names and namespaces, which would make every name unique: "k8s PUT
// taskactions/status", "k8s POST pods".
func KubernetesSpanName(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api": // /api/v1/...
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis": // /apis/GROUP/VERSION/...
		parts = parts[3:]
	default: // /version, /healthz and the like
		return "k8s " + r.Method + " " + r.URL.Path
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:] // namespaces/NS/RESOURCE...
	}
	switch len(parts) {
	case 0:
		return "k8s " + r.Method
	case 1, 2: // RESOURCE [NAME]
		return "k8s " + r.Method + " " + parts[0]
	default: // RESOURCE NAME SUBRESOURCE
		return "k8s " + r.Method + " " + parts[0] + "/" + parts[2]
	}
}
