// Package jaegertest gives tests a real Jaeger: the all-in-one program with in-memory
// storage, built once per version by hack/jaeger.sh into a per-user cache and listening on
// ports of 127.0.0.1 that it chooses itself and logs, plus helpers that read traces back
// through Jaeger's HTTP query API (the one its UI uses: /api/services, /api/traces).
package jaegertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/testserver"
)

// Jaeger is a running Jaeger.
type Jaeger struct {
	dir string
	// The addresses (host:port) of the OTLP receivers and of the query API.
	otlpGRPC, otlpHTTP, queryHTTP string
	client                        *http.Client
}

// Start starts Jaeger for one test and stops it when the test ends. It fails the test
// when Jaeger cannot be built or started.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	j := testserver.Start(t, StartServer)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("jaegertest: end of %s:\n%s", j.LogPath(), j.logTail(40))
		}
	})
	return j
}

// Main runs a test package's tests against one Jaeger started for them; call it from
// TestMain and exit with its result.
func Main(m *testing.M, j **Jaeger) int { return testserver.Main(m, j, StartServer) }

// Binary builds Jaeger with hack/jaeger.sh when it is not cached yet and returns its path.
func Binary() (string, error) {
	bin, err := repo.Build("jaeger.sh", "build")
	if err != nil {
		return "", fmt.Errorf("jaegertest: build failed (the first build compiles Jaeger from the Go module proxy, which must be reachable): %w", err)
	}
	return bin, nil
}

// StartServer starts Jaeger in a new temporary directory; Stop stops it and removes the
// directory.
func StartServer() (*Jaeger, error) {
	if _, err := Binary(); err != nil {
		return nil, err
	}
	script, err := repo.Path("hack", "jaeger.sh")
	if err != nil {
		return nil, fmt.Errorf("jaegertest: finding hack/jaeger.sh: %w", err)
	}
	dir, err := os.MkdirTemp("", "flyte-jaeger.")
	if err != nil {
		return nil, fmt.Errorf("jaegertest: creating a directory: %w", err)
	}
	j := &Jaeger{dir: dir, client: &http.Client{Timeout: 10 * time.Second}}
	// Port 0 everywhere: Jaeger binds what is free and logs what it got.
	cmd := exec.Command(script, "start", dir)
	cmd.Env = append(os.Environ(), "JAEGER_OTLP_GRPC_PORT=0", "JAEGER_OTLP_HTTP_PORT=0", "JAEGER_QUERY_PORT=0",
		"JAEGER_QUERY_GRPC_PORT=0", "JAEGER_HEALTH_PORT=0", "JAEGER_METRICS_PORT=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if _, err := cmd.Output(); err != nil {
		_ = j.Stop()
		return nil, fmt.Errorf("jaegertest: %s start: %w\n%s", script, err, stderr.String())
	}
	if err := j.readAddresses(); err != nil {
		_ = j.Stop()
		return nil, err
	}
	return j, nil
}

// readAddresses finds the addresses Jaeger bound in its log, where each OTLP receiver
// logs its endpoint and the query server its HTTP address as they start listening. The
// log is JSON lines but for the version line Jaeger prints first.
func (j *Jaeger) readAddresses() error {
	data, err := os.ReadFile(j.LogPath())
	if err != nil {
		return fmt.Errorf("jaegertest: %w", err)
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		var entry struct {
			Msg       string `json:"msg"`
			Component string `json:"otelcol.component.id"`
			Endpoint  string `json:"endpoint"`
			HTTPAddr  string `json:"http_addr"`
		}
		if json.Unmarshal(line, &entry) != nil {
			continue
		}
		switch {
		case entry.Component == "otlp" && entry.Msg == "Starting GRPC server":
			j.otlpGRPC = entry.Endpoint
		case entry.Component == "otlp" && entry.Msg == "Starting HTTP server":
			j.otlpHTTP = entry.Endpoint
		case entry.Component == "jaeger_query" && entry.Msg == "Query server started":
			j.queryHTTP = entry.HTTPAddr
		}
	}
	if j.otlpGRPC == "" || j.otlpHTTP == "" || j.queryHTTP == "" {
		return fmt.Errorf("jaegertest: %s does not give every address (OTLP gRPC %q, OTLP HTTP %q, query %q)",
			j.LogPath(), j.otlpGRPC, j.otlpHTTP, j.queryHTTP)
	}
	return nil
}

// Stop stops Jaeger and removes its directory.
func (j *Jaeger) Stop() error {
	script, err := repo.Path("hack", "jaeger.sh")
	if err != nil {
		return fmt.Errorf("jaegertest: finding hack/jaeger.sh: %w", err)
	}
	if out, err := exec.Command(script, "stop", j.dir).CombinedOutput(); err != nil {
		return fmt.Errorf("jaegertest: jaeger.sh stop %s: %w: %s", j.dir, err, out)
	}
	if err := os.RemoveAll(j.dir); err != nil {
		return fmt.Errorf("jaegertest: removing %s: %w", j.dir, err)
	}
	return nil
}

// OTLPEndpoint is the OTLP/HTTP receiver's base URL (http://127.0.0.1:PORT), fit for
// OTEL_EXPORTER_OTLP_ENDPOINT with the default http/protobuf protocol or for
// otlptracehttp.WithEndpointURL (which then posts to /v1/traces).
func (j *Jaeger) OTLPEndpoint() string { return "http://" + j.otlpHTTP }

// OTLPGRPCEndpoint is the OTLP/gRPC receiver's address as host:port, fit for
// otlptracegrpc.WithEndpoint together with otlptracegrpc.WithInsecure.
func (j *Jaeger) OTLPGRPCEndpoint() string { return j.otlpGRPC }

// QueryURL is the base URL of the query service (HTTP API under /api, and the UI).
func (j *Jaeger) QueryURL() string { return "http://" + j.queryHTTP }

// LogPath is Jaeger's log file.
func (j *Jaeger) LogPath() string { return filepath.Join(j.dir, "jaeger.log") }

func (j *Jaeger) logTail(n int) string {
	b, err := os.ReadFile(j.LogPath())
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Trace is a trace as Jaeger's HTTP API returns it.
type Trace struct {
	TraceID string `json:"traceID"`
	Spans   []Span `json:"spans"`
	// Processes maps Span.ProcessID to the process (service) that emitted the span.
	Processes map[string]Process `json:"processes"`
	Warnings  []string           `json:"warnings"`
}

// Span is one span of a Trace. Process is filled in from Trace.Processes.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     uint64      `json:"startTime"` // microseconds since the Unix epoch
	Duration      uint64      `json:"duration"`  // microseconds
	Tags          []KeyValue  `json:"tags"`
	ProcessID     string      `json:"processID"`
	Process       *Process    `json:"process,omitempty"`
	Warnings      []string    `json:"warnings"`
}

// Reference links a span to another, such as its parent (RefType CHILD_OF).
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// Process is the emitter of spans: its service name and resource attributes.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// KeyValue is a tag. Type is string, bool, int64, float64 or binary; numbers decode as
// json.Number so that int64 values keep their precision.
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Tag returns the value of the span's tag key, formatted as a string (as Jaeger's tag
// search compares them).
func (s Span) Tag(key string) (string, bool) {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return fmt.Sprint(kv.Value), true
		}
	}
	return "", false
}

// SpanByOperation returns the first span named op.
func (t Trace) SpanByOperation(op string) (Span, bool) {
	for _, s := range t.Spans {
		if s.OperationName == op {
			return s, true
		}
	}
	return Span{}, false
}

// response is the envelope of every /api answer.
type response[T any] struct {
	Data   T `json:"data"`
	Errors []struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	} `json:"errors"`
}

func (j *Jaeger) get(ctx context.Context, path string, query url.Values, into any) error {
	u := j.QueryURL() + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("jaegertest: building request for %s: %w", u, err)
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return fmt.Errorf("jaegertest: GET %s: %w", u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("jaegertest: reading %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("jaegertest: GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(body))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("jaegertest: decoding %s: %w", u, err)
	}
	return nil
}

// Services lists the services Jaeger has received spans from.
func (j *Jaeger) Services(ctx context.Context) ([]string, error) {
	var r response[[]string]
	if err := j.get(ctx, "/api/services", nil, &r); err != nil {
		return nil, err
	}
	return r.Data, nil
}

// Traces searches the service's traces of the last hour (Jaeger's default look-back, at
// most 100 of them) holding a span with all the tags; the values are compared as strings.
func (j *Jaeger) Traces(ctx context.Context, service string, tags map[string]string) ([]Trace, error) {
	q := url.Values{"service": {service}}
	if len(tags) > 0 {
		b, err := json.Marshal(tags)
		if err != nil {
			return nil, fmt.Errorf("jaegertest: encoding tags: %w", err)
		}
		q.Set("tags", string(b))
	}
	var r response[[]Trace]
	if err := j.get(ctx, "/api/traces", q, &r); err != nil {
		return nil, err
	}
	if len(r.Errors) > 0 {
		return nil, fmt.Errorf("jaegertest: searching traces of %s: %s", service, r.Errors[0].Msg)
	}
	for i := range r.Data {
		resolveProcesses(&r.Data[i])
	}
	return r.Data, nil
}

// Trace fetches one trace by its hex ID.
func (j *Jaeger) Trace(ctx context.Context, traceID string) (Trace, error) {
	var r response[[]Trace]
	if err := j.get(ctx, "/api/traces/"+url.PathEscape(traceID), nil, &r); err != nil {
		return Trace{}, err
	}
	if len(r.Errors) > 0 {
		return Trace{}, fmt.Errorf("jaegertest: fetching trace %s: %s", traceID, r.Errors[0].Msg)
	}
	if len(r.Data) == 0 {
		return Trace{}, fmt.Errorf("jaegertest: trace %s not found", traceID)
	}
	resolveProcesses(&r.Data[0])
	return r.Data[0], nil
}

func resolveProcesses(t *Trace) {
	for i := range t.Spans {
		s := &t.Spans[i]
		if s.Process == nil {
			if p, ok := t.Processes[s.ProcessID]; ok {
				s.Process = &p
			}
		}
	}
}

// WaitForTrace polls Traces until a trace matches and returns the first match. Spans
// reach storage asynchronously (the exporter and Jaeger both batch), so a search right
// after export can come back empty. It gives up when ctx ends.
func (j *Jaeger) WaitForTrace(ctx context.Context, service string, tags map[string]string) (Trace, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		traces, err := j.Traces(ctx, service, tags)
		if err == nil && len(traces) > 0 {
			return traces[0], nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("no matching trace")
			}
			return Trace{}, fmt.Errorf("jaegertest: waiting for a trace of %s with tags %v: %w (last: %w)", service, tags, ctx.Err(), err)
		case <-tick.C:
		}
	}
}
