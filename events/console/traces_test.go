package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/test/jaegertest"
)

// These tests serve the console with an events service that holds every action it is
// asked for, so that only the trace lookup's own part is under test.

// anyAction answers GetAction with an action created a minute ago, whatever it names.
type anyAction struct {
	eventsv1connect.UnimplementedEventsServiceHandler
}

func (anyAction) GetAction(_ context.Context, req *connect.Request[eventsv1.GetActionRequest]) (*connect.Response[eventsv1.GetActionResponse], error) {
	a := &eventsv1.Action{Id: req.Msg.GetId(), CreatedAt: timestamppb.New(time.Now().Add(-time.Minute))}
	return connect.NewResponse(&eventsv1.GetActionResponse{Action: a}), nil
}

// lockedBuffer is a log the console writes to while a test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serveConsole serves the console with Jaeger's query API at jaegerURL, logging to log.
func serveConsole(t *testing.T, jaegerURL string, log *lockedBuffer) *httptest.Server {
	t.Helper()
	_, api := eventsv1connect.NewEventsServiceHandler(anyAction{})
	h, err := Handler(Config{API: api, JaegerQueryURL: jaegerURL, Log: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

const lookupPath = "/console/api/traces?project=demo&domain=development&run=nightly-etl&action=load"

// actionTags are the tags that make a span the action's.
func actionSpanTags() []jaegertest.KeyValue {
	return []jaegertest.KeyValue{
		{Key: "flyte.project", Type: "string", Value: "demo"},
		{Key: "flyte.domain", Type: "string", Value: "development"},
		{Key: "flyte.run", Type: "string", Value: "nightly-etl"},
		{Key: "flyte.action", Type: "string", Value: "load"},
	}
}

// jaegerAnswer is Jaeger's /api/traces answer holding traces.
func jaegerAnswer(t *testing.T, traces ...jaegertest.Trace) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"data": traces})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serveBytes is a Jaeger that answers every search with body.
func serveBytes(t *testing.T, status int, body []byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// closedAddress is an address of the loopback where nothing listens.
func closedAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr
}

// What goes wrong asking Jaeger is the service's to know: the page is told only that the
// trace store is unavailable (or the traces too large to show), and the log has why.
func TestTraceLookupErrorsNameNoInternals(t *testing.T) {
	oversized := func(t *testing.T) string {
		spans := make([]jaegertest.Span, 0, 40000)
		for i := range cap(spans) {
			spans = append(spans, jaegertest.Span{SpanID: fmt.Sprintf("%016x", i), OperationName: "Reconcile", Tags: actionSpanTags()})
		}
		body := jaegerAnswer(t, jaegertest.Trace{TraceID: "0123456789abcdef0123456789abcdef", Spans: spans})
		if len(body) <= maxJaegerBytes {
			t.Fatalf("the oversized answer has only %d bytes", len(body))
		}
		return serveBytes(t, http.StatusOK, body)
	}
	for _, c := range []struct {
		name   string
		jaeger func(t *testing.T) string
		// message is what the page is told; logged is in the log.
		message, logged string
	}{
		{"Jaeger unreachable", closedAddress, "the trace store is unavailable", "connection refused"},
		{"Jaeger failing", func(t *testing.T) string {
			return serveBytes(t, http.StatusInternalServerError, []byte(`{"errors":[{"msg":"badger: /var/lib/jaeger: no space left"}]}`))
		}, "the trace store is unavailable", "500 Internal Server Error"},
		{"Jaeger redirecting", func(t *testing.T) string {
			srv := httptest.NewServer(http.RedirectHandler("http://10.0.0.7:16686/login", http.StatusFound))
			t.Cleanup(srv.Close)
			return srv.URL
		}, "the trace store is unavailable", "302 Found"},
		{"an answer that is not JSON", func(t *testing.T) string {
			return serveBytes(t, http.StatusOK, []byte("<html>jaeger-query.observability.svc.cluster.local</html>"))
		}, "the trace store is unavailable", "invalid character"},
		{"an answer too large", oversized, "the action's traces are too large to show", "larger than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			jaeger := c.jaeger(t)
			var log lockedBuffer
			srv := serveConsole(t, jaeger, &log)
			resp, err := http.Get(srv.URL + lookupPath)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			var body struct{ Code, Message string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || body.Code != "unavailable" || body.Message != c.message {
				t.Errorf("answered %d %s %q, want 503 unavailable %q", resp.StatusCode, body.Code, body.Message, c.message)
			}
			for _, internal := range []string{strings.TrimPrefix(jaeger, "http://"), "10.0.0.7", "/api/traces", "svc.cluster", "badger", "/var/lib", "Jaeger", "jaeger"} {
				if strings.Contains(body.Message, internal) {
					t.Errorf("the answer %q names %q", body.Message, internal)
				}
			}
			if logged := log.String(); !strings.Contains(logged, c.logged) {
				t.Errorf("the log lacks %q:\n%s", c.logged, logged)
			}
		})
	}
}

// What the lookup keeps of a trace: the page draws the first 400 spans, each with a
// few of its attributes.
const (
	wantShownSpans  = 400
	wantAttributes  = 16
	wantTextBytes   = 256
	wantCutTextTail = len("…")
)

// Of a trace, the lookup keeps what the page draws, the earliest spans, and says how many
// there are; no text it keeps is longer than a few hundred bytes, however long Jaeger's.
func TestTraceLookupKeepsWhatThePageDraws(t *testing.T) {
	const total = 1000
	long := strings.Repeat("é", 8<<10)
	start := time.Now().Add(-time.Minute).UnixMicro()
	spans := make([]jaegertest.Span, 0, total)
	for i := range total {
		// Jaeger's order is not the page's: the later a span here, the earlier it began.
		sp := jaegertest.Span{SpanID: fmt.Sprintf("%016x", i), OperationName: "Reconcile", ProcessID: "p1",
			StartTime: uint64(start) + uint64(total-i), Duration: 10}
		for k := range 40 {
			sp.Tags = append(sp.Tags, jaegertest.KeyValue{Key: fmt.Sprintf("flyte.extra%d", k), Type: "string", Value: "v"})
		}
		spans = append(spans, sp)
	}
	// Only the latest span names the action: one the page does not draw.
	spans[0].Tags = append(spans[0].Tags, actionSpanTags()...)
	// The earliest has a long name and a long attribute, a text cut in a character.
	spans[total-1].OperationName = long
	spans[total-1].Tags[0].Value = "x" + long
	body := jaegerAnswer(t, jaegertest.Trace{TraceID: "0123456789abcdef0123456789abcdef", Spans: spans,
		Processes: map[string]jaegertest.Process{"p1": {ServiceName: "executor"}}})
	if len(body) > maxJaegerBytes {
		t.Fatalf("the answer has %d bytes, more than a lookup reads", len(body))
	}
	var log lockedBuffer
	srv := serveConsole(t, serveBytes(t, http.StatusOK, body), &log)
	resp, err := http.Get(srv.URL + lookupPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var got struct {
		Traces []struct {
			SpanCount int `json:"spanCount"`
			Spans     []struct {
				SpanID     string            `json:"spanId"`
				Service    string            `json:"service"`
				Name       string            `json:"name"`
				Start      int64             `json:"start"`
				Attributes map[string]string `json:"attributes"`
			} `json:"spans"`
		} `json:"traces"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatalf("%s: %v", resp.Status, err)
	}
	if len(got.Traces) != 1 {
		t.Fatalf("%d traces, want 1 (%s); log:\n%s", len(got.Traces), resp.Status, log.String())
	}
	tr := got.Traces[0]
	if tr.SpanCount != total || len(tr.Spans) != wantShownSpans {
		t.Fatalf("%d spans of %d, want %d of %d", len(tr.Spans), tr.SpanCount, wantShownSpans, total)
	}
	for _, sp := range tr.Spans {
		if sp.Start-start > wantShownSpans {
			t.Errorf("span %s (start %d) is kept, but not among the %d earliest", sp.SpanID, sp.Start-start, wantShownSpans)
		}
		if sp.Service != "executor" {
			t.Errorf("span %s: service %q", sp.SpanID, sp.Service)
		}
		if len(sp.Attributes) > wantAttributes {
			t.Errorf("span %s keeps %d attributes", sp.SpanID, len(sp.Attributes))
		}
		texts := []string{sp.Name}
		for k, v := range sp.Attributes {
			texts = append(texts, k, v)
		}
		for _, s := range texts {
			if len(s) > wantTextBytes+wantCutTextTail || !utf8.ValidString(s) {
				t.Errorf("span %s keeps a text of %d bytes (valid UTF-8: %v)", sp.SpanID, len(s), utf8.ValidString(s))
				break
			}
		}
	}
}
