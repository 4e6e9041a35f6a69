package cloudevents

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/cloudevents/sdk-go/v2/types"
)

// receiver is a CloudEvents HTTP receiver: it decodes each request with the SDK and
// answers with the status its script gives the event's id (200 by default); a batch is
// answered with the status of its first scripted event.
type receiver struct {
	t        testing.TB
	mu       sync.Mutex
	got      []event.Event
	accepted []event.Event   // those it answered 2xx
	reqs     []*http.Request // headers and URL only
	status   map[string]int  // by event id
	body     map[string]string
	delay    time.Duration
	conns    atomic.Int32
}

func newReceiver(t testing.TB) *receiver {
	return &receiver{t: t, status: map[string]int{}, body: map[string]string{}}
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var events []event.Event
	if cehttp.IsHTTPBatch(r.Header) {
		batch, err := cehttp.NewEventsFromHTTPRequest(r)
		if err != nil || len(batch) == 0 {
			rc.t.Errorf("the receiver cannot decode the batch (%d events): %v", len(batch), err)
			http.Error(w, "undecodable", http.StatusUnsupportedMediaType)
			return
		}
		events = batch
	} else {
		ev, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
		if err != nil {
			rc.t.Errorf("the receiver cannot decode the request: %v", err)
			http.Error(w, err.Error(), http.StatusUnsupportedMediaType)
			return
		}
		events = []event.Event{*ev}
	}
	rc.mu.Lock()
	var status int
	var body string
	for _, ev := range events {
		if err := ev.Validate(); err != nil {
			rc.t.Errorf("the receiver got an invalid event: %v", err)
		}
		if status == 0 {
			status, body = rc.status[ev.ID()], rc.body[ev.ID()]
		}
	}
	rc.got = append(rc.got, events...)
	if status == 0 || status/100 == 2 {
		rc.accepted = append(rc.accepted, events...)
	}
	rc.reqs = append(rc.reqs, &http.Request{Header: r.Header.Clone(), URL: r.URL, Proto: r.Proto})
	delay := rc.delay
	rc.mu.Unlock()
	time.Sleep(delay)
	if status == 0 {
		status = http.StatusOK
	}
	if status >= 300 && status < 400 {
		w.Header().Set("Location", "/elsewhere?sig=s3cret")
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func (rc *receiver) events() []event.Event {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

func (rc *receiver) acceptedEvents() []event.Event {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.accepted)
}

func (rc *receiver) requests() []*http.Request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.reqs)
}

// serve starts rc over plain HTTP/1.1, or over TLS with HTTP/2, and returns a sink of
// it (with caFile for TLS, so the sink trusts the test server's certificate).
func serve(t testing.TB, rc *receiver, h2 bool) *HTTPSpec {
	t.Helper()
	srv := httptest.NewUnstartedServer(rc)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			rc.conns.Add(1)
		}
	}
	if !h2 {
		srv.Start()
		t.Cleanup(srv.Close)
		return &HTTPSpec{URL: srv.URL + "/hook"}
	}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &HTTPSpec{URL: srv.URL + "/hook", CAFile: ca}
}

// openSink opens the sink spec describes, as the file's block for it.
func openSink(t testing.TB, spec SinkSpec) Sink {
	t.Helper()
	c, err := spec.Config()
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestHTTPDelivers(t *testing.T) {
	for _, proto := range []struct {
		name  string
		h2    bool
		major int
	}{{"HTTP/1.1", false, 1}, {"HTTP/2", true, 2}} {
		for _, mode := range []Mode{Binary, Structured, Batched} {
			t.Run(proto.name+" "+string(mode), func(t *testing.T) {
				rc := newReceiver(t)
				h := serve(t, rc, proto.h2)
				h.URL, h.Mode = h.URL+"?code=kept", mode
				sink := openSink(t, SinkSpec{HTTP: h})
				events := cloudEvents(t, 20, 3)
				results, err := sink.Publish(context.Background(), events)
				if err != nil {
					t.Fatal(err)
				}
				if want := slices.Repeat([]Outcome{Delivered}, len(events)); !slices.Equal(outcomes(results), want) {
					t.Fatalf("outcomes %v, want all delivered", results)
				}
				got := rc.events()
				if !slices.Equal(ids(got), ids(events)) {
					t.Fatalf("the receiver got %v, want %v in order", ids(got), ids(events))
				}
				for i, e := range got {
					want := events[i]
					if e.Type() != want.Type() || e.Source() != want.Source() || e.Subject() != want.Subject() ||
						!e.Time().Equal(want.Time()) || string(e.Data()) != string(want.Data()) ||
						attempt(t, e) != 1 || e.Extensions()[ExtPartitionKey] != want.Extensions()[ExtPartitionKey] {
						t.Errorf("received %v\nsent %v", e, want)
					}
				}
				for _, r := range rc.requests() {
					if r.Proto != "HTTP/"+map[int]string{1: "1.1", 2: "2.0"}[proto.major] {
						t.Errorf("request over %s, want %s", r.Proto, proto.name)
					}
					ct := r.Header.Get("Content-Type")
					switch mode {
					case Binary:
						if ct != event.ApplicationJSON || r.Header.Get("Ce-Id") == "" || r.Header.Get("Ce-Flyteproject") != "flytesnacks" {
							t.Errorf("binary mode: Content-Type %q, headers %v", ct, r.Header)
						}
					case Structured:
						if ct != event.ApplicationCloudEventsJSON || r.Header.Get("Ce-Id") != "" {
							t.Errorf("structured mode: Content-Type %q, headers %v", ct, r.Header)
						}
					case Batched:
						if ct != event.ApplicationCloudEventsBatchJSON || r.Header.Get("Ce-Id") != "" {
							t.Errorf("batched mode: Content-Type %q, headers %v", ct, r.Header)
						}
					}
					if q := r.URL.Query(); q.Get("code") != "kept" || len(q) != 1 {
						t.Errorf("the receiver was called with query %q: want its own parameters only", r.URL.RawQuery)
					}
				}
				wantRequests := len(events)
				if mode == Batched {
					wantRequests = 1 // 20 events, within the default batch size
				}
				if n := len(rc.requests()); n != wantRequests {
					t.Errorf("%d requests for %d events, want %d", n, len(events), wantRequests)
				}
				if n := rc.conns.Load(); n != 1 {
					t.Errorf("%d connections for %d events, want one kept alive", n, len(events))
				}
			})
		}
	}
}

// attempt reads the flyteattempt extension, which comes back from binary mode's headers
// as a string and from JSON as a number.
func attempt(t testing.TB, e event.Event) int32 {
	t.Helper()
	n, err := types.ToInteger(e.Extensions()[ExtAttempt])
	if err != nil {
		t.Errorf("flyteattempt: %v", err)
	}
	return n
}

func TestHTTPOutcomes(t *testing.T) {
	events := cloudEvents(t, 5, 5)
	third := events[2].ID()
	tests := []struct {
		name     string
		status   int
		body     string
		want     []Outcome
		received int    // requests the receiver got
		detail   string // the third result's detail starts with it
	}{
		{"503 stops the batch", 503, "busy", []Outcome{Delivered, Delivered, Retry}, 3, "HTTP 503: busy"},
		{"429 stops the batch", 429, "", []Outcome{Delivered, Delivered, Retry}, 3, "HTTP 429: "},
		{"408 stops the batch", 408, "", []Outcome{Delivered, Delivered, Retry}, 3, "HTTP 408: "},
		{"a redirect is not followed", 307, "", []Outcome{Delivered, Delivered, Retry}, 3, "HTTP 307: redirects are not followed (Location: /REDACTED?sig=REDACTED)"},
		{"400 rejects one event", 400, "bad thing", []Outcome{Delivered, Delivered, Reject, Delivered, Delivered}, 5, "HTTP 400: bad thing"},
		{"404 rejects one event", 404, "", []Outcome{Delivered, Delivered, Reject, Delivered, Delivered}, 5, "HTTP 404: "},
		{"a long body is cut", 422, strings.Repeat("é", 10000), []Outcome{Delivered, Delivered, Reject, Delivered, Delivered}, 5, "HTTP 422: " + strings.Repeat("é", (256-len("…"))/2) + "…"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := newReceiver(t)
			rc.status[third], rc.body[third] = tc.status, tc.body
			sink := openSink(t, SinkSpec{HTTP: serve(t, rc, false)})
			results, err := sink.Publish(context.Background(), events)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(outcomes(results), tc.want) {
				t.Fatalf("outcomes %v, want %v", results, tc.want)
			}
			if got := len(rc.events()); got != tc.received {
				t.Errorf("the receiver got %d events, want %d", got, tc.received)
			}
			if d := results[2].Detail; !strings.HasPrefix(d, tc.detail) || len(d) > len("HTTP 422: ")+256 {
				t.Errorf("detail %q, want it to start with %q and hold at most 256 bytes of body", d, tc.detail)
			}
			for i, r := range results {
				if r.Outcome == Delivered && r.Detail != "" {
					t.Errorf("result %d: delivered with detail %q", i, r.Detail)
				}
			}
		})
	}
}

// TestHTTPBatchOutcomes: a batch is delivered or retried whole; one the receiver refuses
// is sent again an event per request, so only the refused event is rejected.
func TestHTTPBatchOutcomes(t *testing.T) {
	events := cloudEvents(t, 7, 7)
	fifth := events[4].ID()
	tests := []struct {
		name     string
		status   int
		want     []Outcome
		requests int
		accepted []int // indexes of the events the receiver accepted, in order
		detail   string
	}{
		{"all delivered", 0, slices.Repeat([]Outcome{Delivered}, 7), 3, []int{0, 1, 2, 3, 4, 5, 6}, ""},
		{"503 stops at the batch", 503, []Outcome{Delivered, Delivered, Delivered, Retry}, 2, []int{0, 1, 2}, "HTTP 503: "},
		{"400 rejects the one event", 400, []Outcome{Delivered, Delivered, Delivered, Delivered, Reject, Delivered, Delivered}, 6, []int{0, 1, 2, 3, 5, 6}, "HTTP 400: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := newReceiver(t)
			rc.status[fifth] = tc.status
			h := serve(t, rc, false)
			h.Mode, h.BatchSize = Batched, 3
			sink := openSink(t, SinkSpec{HTTP: h})
			results, err := sink.Publish(context.Background(), events)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(outcomes(results), tc.want) {
				t.Fatalf("outcomes %v, want %v", results, tc.want)
			}
			if got := len(rc.requests()); got != tc.requests {
				t.Errorf("%d requests, want %d", got, tc.requests)
			}
			var want []string
			for _, i := range tc.accepted {
				want = append(want, events[i].ID())
			}
			if got := ids(rc.acceptedEvents()); !slices.Equal(got, want) {
				t.Errorf("the receiver accepted %v, want %v", got, want)
			}
			for _, r := range results {
				if r.Outcome != Delivered && !strings.HasPrefix(r.Detail, tc.detail) {
					t.Errorf("detail %q, want it to start with %q", r.Detail, tc.detail)
				}
			}
		})
	}
}

func TestHTTPRetriesTransportFailures(t *testing.T) {
	events := cloudEvents(t, 3, 3)

	t.Run("timeout", func(t *testing.T) {
		rc := newReceiver(t)
		rc.delay = 300 * time.Millisecond
		h := serve(t, rc, false)
		h.Timeout = "50ms"
		sink := openSink(t, SinkSpec{HTTP: h})
		results, err := sink.Publish(context.Background(), events)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(outcomes(results), []Outcome{Retry}) || !strings.Contains(results[0].Detail, "no response within 50ms") {
			t.Errorf("results %v, want one Retry for a timeout", results)
		}
	})

	t.Run("connection refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		sink := openSink(t, SinkSpec{HTTP: &HTTPSpec{URL: "http://" + addr + "/hook?sig=s3cret"}})
		results, err := sink.Publish(context.Background(), events)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(outcomes(results), []Outcome{Retry}) || !strings.Contains(results[0].Detail, "refused") || strings.Contains(results[0].Detail, "s3cret") {
			t.Errorf("results %v, want one Retry naming the refusal without the query", results)
		}
	})

	t.Run("the caller's context ends", func(t *testing.T) {
		rc := newReceiver(t)
		rc.delay = 200 * time.Millisecond
		sink := openSink(t, SinkSpec{HTTP: serve(t, rc, false)})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		results, err := sink.Publish(ctx, events)
		if err == nil || !slices.Equal(outcomes(results), []Outcome{Delivered}) {
			t.Errorf("results %v, error %v: want the first delivered, then the context's error", results, err)
		}
	})
}

func TestHTTPBearerToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t)
	events := cloudEvents(t, 2, 2)
	rc.status[events[1].ID()] = http.StatusForbidden
	h := serve(t, rc, true)
	h.TokenFile = tokenFile
	sink := openSink(t, SinkSpec{HTTP: h})
	publish := func() []Result {
		results, err := sink.Publish(context.Background(), events)
		if err != nil {
			t.Fatal(err)
		}
		return results
	}
	results := publish()
	// The token is rotated: the next batch carries the new one.
	if err := os.WriteFile(tokenFile, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	publish()
	var auth []string
	for _, r := range rc.requests() {
		auth = append(auth, r.Header.Get("Authorization"))
	}
	if want := []string{"Bearer first", "Bearer first", "Bearer second", "Bearer second"}; !slices.Equal(auth, want) {
		t.Errorf("Authorization headers %q, want %q", auth, want)
	}
	for _, r := range results {
		if strings.Contains(r.Detail, "first") {
			t.Errorf("detail %q shows the token", r.Detail)
		}
	}
	// A token file gone missing is a Retry, not a reason to drop events.
	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	if results := publish(); !slices.Equal(outcomes(results), []Outcome{Retry}) || !strings.Contains(results[0].Detail, "tokenFile") {
		t.Errorf("results %v without a token file, want one Retry naming it", results)
	}
}

// TestHTTPDetailHidesTheSinksSecrets: a receiver that echoes the request it refuses (a
// gateway, a debugging receiver) does not put the sink's credentials into the detail,
// which is kept with the dead letter, listed by EgressService and logged: not its
// bearer token, its query's values or its path, wherever the echo puts them, even
// where the excerpt or the read of the body cuts one in two. The detail is the status
// and at most 256 bytes of the body, valid UTF-8.
func TestHTTPDetailHidesTheSinksSecrets(t *testing.T) {
	const (
		token       = "tok-Zq8vN3xL0pR7"
		pathSecret  = "XXXXsecretXXXXpath"
		querySecret = "s1gQu3rySecret"
	)
	longToken := "eyJ" + strings.Repeat("Lg9", 100) // 303 bytes: a JWT's length
	echo := func(r *http.Request) string {
		return fmt.Sprintf("%s %s %s\nAuthorization: %s\n", r.Method, r.URL.RequestURI(), r.Proto, r.Header.Get("Authorization"))
	}
	tests := []struct {
		name  string
		token string
		body  func(r *http.Request) string
	}{
		{"the request echoed", token, echo},
		{"as JSON", token, func(r *http.Request) string {
			b, _ := json.Marshal(map[string]any{"url": r.URL.String(), "path": r.URL.Path, "query": r.URL.Query(), "headers": r.Header})
			return string(b)
		}},
		{"a secret across the excerpt's end", token, func(r *http.Request) string {
			// The token starts twelve bytes before the excerpt's end.
			return strings.Repeat(".", 256-12) + strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") + " " + echo(r)
		}},
		{"a long token across the end of what is read", longToken, func(r *http.Request) string {
			return strings.Repeat(r.Header.Get("Authorization")+" ", 20)
		}},
		{"the path unescaped and its segments alone", token, func(r *http.Request) string {
			return "unknown webhook " + pathSecret + " at " + r.URL.Path
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusUnprocessableEntity)
				_, _ = io.WriteString(w, tc.body(r))
			}))
			t.Cleanup(srv.Close)
			tokenFile := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(tokenFile, []byte(tc.token), 0o600); err != nil {
				t.Fatal(err)
			}
			sink := openSink(t, SinkSpec{HTTP: &HTTPSpec{URL: srv.URL + "/services/T000/B000/" + pathSecret + "?sig=" + querySecret, TokenFile: tokenFile}})
			results, err := sink.Publish(context.Background(), cloudEvents(t, 1, 1))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(outcomes(results), []Outcome{Reject}) {
				t.Fatalf("results %v, want one Reject", results)
			}
			d := results[0].Detail
			body, ok := strings.CutPrefix(d, "HTTP 422: ")
			if !ok || len(body) > 256 || !utf8.ValidString(d) {
				t.Errorf("detail %q (%d bytes of body), want HTTP 422 and at most 256 bytes of valid UTF-8", d, len(body))
			}
			// Eight bytes of a secret are enough to tell it is there.
			for _, secret := range []string{tc.token, pathSecret, querySecret} {
				for i := 0; i+8 <= len(secret); i++ {
					if strings.Contains(d, secret[i:i+8]) {
						t.Fatalf("detail %q shows part of the secret %q", d, secret)
					}
				}
			}
			if !strings.Contains(d, "REDACTED") {
				t.Errorf("detail %q does not say what it left out", d)
			}
		})
	}
}

func TestBoundDetail(t *testing.T) {
	tests := []struct{ in, want string }{
		{"ok", "ok"},
		{"nul\x00byte", "nul\uFFFDbyte"},
		{"bad\xffutf8", "bad\uFFFDutf8"},
		{strings.Repeat("x", 5000), strings.Repeat("x", MaxDetail-len("…")) + "…"},
		// A cut inside a 3-byte character backs off to the character's start.
		{strings.Repeat("日", 1000), strings.Repeat("日", (MaxDetail-len("…"))/3) + "…"},
	}
	for _, tc := range tests {
		out := boundDetail(tc.in)
		if out != tc.want || len(out) > MaxDetail || !utf8.ValidString(out) {
			t.Errorf("boundDetail(%.20q...) = %.40q... (%d bytes), want %.40q...", tc.in, out, len(out), tc.want)
		}
	}
}
