package console_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/jaegertest"
)

// The trace lookups the events service makes at once, in the whole process; beyond them
// it answers 429.
const wantLookupsAtOnce = 4

// busyJaeger counts the searches it is asked at once and answers each with body.
type busyJaeger struct {
	body         []byte
	atOnce, most atomic.Int32
	// hold, when not nil, keeps each search unanswered until it is closed.
	hold chan struct{}
}

func (j *busyJaeger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := j.atOnce.Add(1)
	defer j.atOnce.Add(-1)
	for m := j.most.Load(); n > m && !j.most.CompareAndSwap(m, n); m = j.most.Load() {
	}
	if j.hold != nil {
		select {
		case <-j.hold:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(j.body)
}

func (j *busyJaeger) start(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(j)
	t.Cleanup(srv.Close)
	return srv.URL
}

// answer is what one lookup was answered, its body read and dropped.
type answer struct {
	status     int
	retryAfter string
	err        error
}

func lookUp(url, token string) answer {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return answer{err: err}
	}
	return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
}

// lookUpAtOnce starts n lookups together and returns where their answers arrive.
func lookUpAtOnce(n int, url, token string) <-chan answer {
	answers := make(chan answer, n)
	for range n {
		go func() { answers <- lookUp(url, token) }()
	}
	return answers
}

// checkTurnedAway checks that a lookup was either answered or told to come back later.
func checkTurnedAway(t *testing.T, a answer) (answered bool) {
	t.Helper()
	switch {
	case a.err != nil:
		t.Errorf("a lookup failed: %v", a.err)
	case a.status == http.StatusOK:
		return true
	case a.status != http.StatusTooManyRequests:
		t.Errorf("a lookup was answered %d, want 200 or 429", a.status)
	default:
		if s, err := strconv.Atoi(a.retryAfter); err != nil || s < 1 {
			t.Errorf("a 429 says Retry-After %q, want a number of seconds", a.retryAfter)
		}
	}
	return false
}

// Lookups beyond the bound are answered 429 at once, with when to come back, instead of
// waiting for Jaeger with the others; once those end, lookups are answered again.
func TestTraceLookupsBeyondTheBoundAreTurnedAway(t *testing.T) {
	jaeger := &busyJaeger{body: []byte(`{"data":[]}`), hold: make(chan struct{})}
	var release sync.Once
	stopHolding := func() { release.Do(func() { close(jaeger.hold) }) }
	s := startService(t, func(c *events.Config) { c.JaegerQueryURL = jaeger.start(t) })
	t.Cleanup(stopHolding) // before the fake Jaeger closes: cleanups run last first
	sample(t, s, time.Now().Add(-time.Minute).Truncate(time.Second))
	lookup := s.console + "api/traces?project=demo&domain=development&run=nightly-etl&action=load"

	const asked = 3 * wantLookupsAtOnce
	answers := lookUpAtOnce(asked, lookup, s.tokens.Viewer)
	var early []answer
	eventually.True(t, 15*time.Second, func() bool {
		for len(answers) > 0 {
			early = append(early, <-answers)
		}
		return int(jaeger.atOnce.Load())+len(early) == asked
	}, func() string {
		return fmt.Sprintf("%d lookups wait for Jaeger and %d are answered, of %d", jaeger.atOnce.Load(), len(early), asked)
	})
	if most := jaeger.most.Load(); most > wantLookupsAtOnce {
		t.Errorf("Jaeger was asked %d searches at once, want at most %d", most, wantLookupsAtOnce)
	}
	if len(early) != asked-wantLookupsAtOnce {
		t.Errorf("%d lookups were answered while %d waited for Jaeger, want %d turned away", len(early), jaeger.atOnce.Load(), asked-wantLookupsAtOnce)
	}
	for _, a := range early {
		if checkTurnedAway(t, a) {
			t.Error("a lookup was answered while Jaeger held every search")
		}
	}

	stopHolding()
	for range asked - len(early) {
		if a := <-answers; a.err != nil || a.status != http.StatusOK {
			t.Errorf("a lookup Jaeger answered: %d %v, want 200", a.status, a.err)
		}
	}
	if a := lookUp(lookup, s.tokens.Viewer); a.status != http.StatusOK {
		t.Errorf("a lookup after the others ended: %d %v, want 200", a.status, a.err)
	}
}

// bigTrace is Jaeger's answer of one trace of the action with n spans, each tagged as the
// executor tags its spans.
func bigTrace(t *testing.T, n int) []byte {
	t.Helper()
	tags := []jaegertest.KeyValue{
		{Key: "flyte.project", Type: "string", Value: "demo"},
		{Key: "flyte.domain", Type: "string", Value: "development"},
		{Key: "flyte.run", Type: "string", Value: "nightly-etl"},
		{Key: "flyte.action", Type: "string", Value: "load"},
		{Key: "flyte.attempt", Type: "int64", Value: 2},
		{Key: "flyte.phase", Type: "string", Value: "RUNNING"},
		{Key: "rpc.method", Type: "string", Value: "Record"},
		{Key: "otel.status_code", Type: "string", Value: "OK"},
		{Key: "span.kind", Type: "string", Value: "client"},
	}
	start := uint64(time.Now().Add(-time.Minute).UnixMicro())
	spans := make([]jaegertest.Span, n)
	for i := range spans {
		spans[i] = jaegertest.Span{
			TraceID: "0123456789abcdef0123456789abcdef", SpanID: fmt.Sprintf("%016x", i+1), OperationName: "flyte.events.v1.EventsService/Record",
			References: []jaegertest.Reference{{RefType: "CHILD_OF", TraceID: "0123456789abcdef0123456789abcdef", SpanID: fmt.Sprintf("%016x", i/2+1)}},
			StartTime:  start + uint64(i), Duration: 100, Tags: tags, ProcessID: "p1",
		}
	}
	body, err := json.Marshal(map[string]any{"data": []jaegertest.Trace{{
		TraceID: "0123456789abcdef0123456789abcdef", Spans: spans, Processes: map[string]jaegertest.Process{"p1": {ServiceName: "executor"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// peakHeap samples the heap in use after a collection, which is what the process holds,
// until stop is called, and returns the largest sample.
func peakHeap() (stop func() uint64) {
	done := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		var most uint64
		var m runtime.MemStats
		for {
			runtime.GC()
			runtime.ReadMemStats(&m)
			most = max(most, m.HeapAlloc)
			select {
			case <-done:
				peak <- most
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); return <-peak }
}

// Many viewers looking up a large trace at once do not take the service's memory: a few
// lookups run, each holding what it answers rather than Jaeger's whole answer, and the
// rest are turned away. The events service runs in this process, so its heap is this
// test's.
func TestConcurrentTraceLookupsStayInBoundedMemory(t *testing.T) {
	const (
		spans   = 9000
		viewers = 40
		// allowed is what the lookups may hold together, above what the process held
		// before; without the bounds they held over a gigabyte.
		allowed = 48 << 20
	)
	jaeger := &busyJaeger{body: bigTrace(t, spans)}
	if n := len(jaeger.body); n < 4<<20 || n > 8<<20 {
		t.Fatalf("the trace is %d bytes: it must be large, and not more than a lookup reads (8 MiB)", n)
	}
	// The lookups that run must end whatever the machine's load: what is measured is
	// memory, and a lookup cut by its deadline holds nothing to measure.
	s := startService(t, func(c *events.Config) { c.JaegerQueryURL, c.JaegerTimeout = jaeger.start(t), 5*time.Minute })
	sample(t, s, time.Now().Add(-time.Minute).Truncate(time.Second))
	lookup := s.console + "api/traces?project=demo&domain=development&run=nightly-etl&action=load"

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	stop := peakHeap()
	answers := lookUpAtOnce(viewers, lookup, s.tokens.Viewer)
	answered := 0
	for range viewers {
		if checkTurnedAway(t, <-answers) {
			answered++
		}
	}
	peak := stop()
	held := int64(peak) - int64(before.HeapAlloc)
	t.Logf("%d lookups at once: %d answered, Jaeger asked %d at once, %.1f MiB held at most (of %.1f MiB before)",
		viewers, answered, jaeger.most.Load(), float64(held)/(1<<20), float64(before.HeapAlloc)/(1<<20))
	if held > allowed {
		t.Errorf("the lookups held %.0f MiB at once, want at most %d MiB", float64(held)/(1<<20), allowed>>20)
	}
	if answered == 0 {
		t.Error("no lookup was answered")
	}
	if most := jaeger.most.Load(); most > wantLookupsAtOnce {
		t.Errorf("Jaeger was asked %d searches at once, want at most %d", most, wantLookupsAtOnce)
	}

	// What a lookup answers is what the page draws, and how many spans there are.
	resp, err := authorizedGet(lookup, s.tokens.Viewer)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var got struct {
		Traces []struct {
			SpanCount int               `json:"spanCount"`
			Spans     []json.RawMessage `json:"spans"`
		} `json:"traces"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatalf("%s: %v", resp.Status, err)
	}
	if len(got.Traces) != 1 || got.Traces[0].SpanCount != spans || len(got.Traces[0].Spans) > 400 {
		for _, tr := range got.Traces {
			t.Errorf("a trace of %d spans answers %d", tr.SpanCount, len(tr.Spans))
		}
		t.Fatalf("%d traces, want 1 of %d spans with at most 400 of them", len(got.Traces), spans)
	}
}

func authorizedGet(url, token string) (*http.Response, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return http.DefaultClient.Do(req)
}
