package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
)

// An action's trace ID is its TaskAction's UID (executor/tracing), which no event
// carries; but the executor's spans name the action (flyte.project, flyte.domain,
// flyte.run, flyte.action), so its traces are found in Jaeger by those tags. The lookup
// is not a proxy: the events service asks Jaeger one search it builds itself, and
// answers only the traces that name the action the caller was allowed to read.

// The attributes the executor puts on its spans (executor/tracing).
var actionTags = [...]string{"flyte.project", "flyte.domain", "flyte.run", "flyte.action"}

const (
	// defaultJaegerTimeout bounds one lookup, unless Config says otherwise.
	defaultJaegerTimeout = 10 * time.Second
	// maxJaegerBytes bounds Jaeger's answer; a larger one is refused, not cut.
	maxJaegerBytes = 8 << 20
	// maxTraces bounds the traces asked for: an action deleted and created again under
	// the same names has one per creation.
	maxTraces = 5
	// lookBefore widens the search before the action's first event: the executor's
	// first reconciles come before it.
	lookBefore = 10 * time.Minute
	// maxLookups bounds the lookups reading Jaeger's answers at once, in the whole
	// process: beyond it a lookup is turned away (429) rather than queued, so viewers
	// asking together hold a bounded amount of memory, however many they are.
	maxLookups = 4
	// retryAfter is how long a lookup turned away is told to wait: about one lookup.
	retryAfter = 2 * time.Second
	// What is kept of a trace is what the page draws: its first 400 spans (the earliest),
	// each with a few attributes of a few hundred bytes. A lookup holds that, not
	// Jaeger's answer, which it reads a span at a time (jaeger.go).
	maxShownSpans = 400
	maxAttributes = 16
	maxTextBytes  = 256
	// maxProcesses bounds the service names kept of a trace's processes.
	maxProcesses = 1024
)

// lookups holds a slot for each lookup reading Jaeger's answer. It is the process's,
// not a handler's: the bound is on the process's memory.
var lookups = make(chan struct{}, maxLookups)

// startLookup takes a lookup's slot, or reports that every one is taken.
func startLookup() (done func(), ok bool) {
	select {
	case lookups <- struct{}{}:
		return func() { <-lookups }, true
	default:
		return nil, false
	}
}

// The page is told what failed in general terms; the details, which name Jaeger's
// address and what it answered, go to the log.
var (
	errTooLarge       = errors.New("the answer is larger than a lookup reads")
	errStoreDown      = errors.New("the trace store is unavailable")
	errTracesTooLarge = errors.New("the action's traces are too large to show")
	errBusy           = errors.New("the events service is looking up as many traces as it may at once: try again shortly")
)

var traceIDPattern = regexp.MustCompile(`^[0-9a-f]{16,32}$`)

type traceLookup struct {
	api     eventsv1connect.EventsServiceClient
	query   *url.URL // nil when tracing is not configured
	ui      string
	service string
	client  *http.Client
	now     func() time.Time
	log     *slog.Logger
}

func newTraceLookup(cfg Config) (*traceLookup, error) {
	t := &traceLookup{
		// The same GetAction the page makes, through the same authentication, so the
		// lookup is allowed exactly when reading the action is.
		api:     eventsv1connect.NewEventsServiceClient(&http.Client{Transport: inProcess{cfg.API}}, "http://in-process"),
		ui:      strings.TrimSuffix(cfg.JaegerUIURL, "/"),
		service: cmp.Or(cfg.JaegerService, "executor"),
		client: &http.Client{
			Timeout: cmp.Or(cfg.JaegerTimeout, defaultJaegerTimeout),
			// Only the search asked for: a redirect elsewhere is not followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		now: time.Now,
		log: cfg.Log,
	}
	if cfg.JaegerQueryURL != "" {
		u, err := url.Parse(cfg.JaegerQueryURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("jaeger-query-url: %q is not an http(s) URL", cfg.JaegerQueryURL)
		}
		t.query = u.JoinPath("api", "traces")
	}
	if t.ui != "" {
		if u, err := url.Parse(t.ui); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("jaeger-ui-url: %q is not an http(s) URL", cfg.JaegerUIURL)
		}
	}
	return t, nil
}

// span is a span as the page draws it; times in microseconds since the epoch.
type span struct {
	SpanID     string            `json:"spanId"`
	ParentID   string            `json:"parentId,omitempty"`
	Service    string            `json:"service"`
	Name       string            `json:"name"`
	Start      int64             `json:"start"`
	Duration   int64             `json:"duration"`
	Error      bool              `json:"error,omitempty"`
	Attributes map[string]string `json:"attributes,omitempty"`

	// Resolved once the whole trace is read: Jaeger may send a trace's processes after
	// its spans, and its ID after both.
	processID, parentTrace string
}

type trace struct {
	TraceID string `json:"traceId"`
	Spans   []span `json:"spans"`
	// SpanCount is how many spans the trace has; Spans are the first the page draws.
	SpanCount int    `json:"spanCount"`
	UIURL     string `json:"uiUrl,omitempty"`
}

func (t *traceLookup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id := &flytecorev1.ActionIdentifier{Project: q.Get("project"), Domain: q.Get("domain"), Run: q.Get("run"), Action: q.Get("action")}
	if t.query == nil {
		writeError(w, r, connect.NewError(connect.CodeNotFound, errors.New("traces are not shown: the events service has no --jaeger-query-url")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), t.client.Timeout)
	defer cancel()
	req := connect.NewRequest(&eventsv1.GetActionRequest{Id: id})
	if c, ok := q["cluster"]; ok && len(c) == 1 { // another cluster's action may have the name
		req.Msg.Cluster = &c[0]
	}
	if a := r.Header.Get("Authorization"); a != "" {
		req.Header().Set("Authorization", a)
	}
	resp, err := t.api.GetAction(ctx, req)
	if err != nil {
		writeError(w, r, err)
		return
	}
	// Taken once the caller may read the action, so that callers without a token cannot
	// keep the slots from those with one.
	done, ok := startLookup()
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(retryAfter/time.Second)))
		writeError(w, r, connect.NewError(connect.CodeResourceExhausted, errBusy))
		return
	}
	defer done()
	traces, err := t.search(ctx, id, resp.Msg.GetAction())
	if err != nil {
		t.failed(w, r, id, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"traces": traces})
}

// failed logs why a lookup failed and tells the caller only that it did.
func (t *traceLookup) failed(w http.ResponseWriter, r *http.Request, id *flytecorev1.ActionIdentifier, err error) {
	if r.Context().Err() == nil { // a caller that left is no failure of Jaeger's
		t.log.Warn("looking up an action's traces", "project", id.GetProject(), "domain", id.GetDomain(),
			"run", id.GetRun(), "action", id.GetAction(), "error", err)
	}
	public := errStoreDown
	if errors.Is(err, errTooLarge) {
		public = errTracesTooLarge
	}
	writeError(w, r, connect.NewError(connect.CodeUnavailable, public))
}

// search asks Jaeger for the traces whose spans name the action, from a little before
// its first event until now.
func (t *traceLookup) search(ctx context.Context, id *flytecorev1.ActionIdentifier, a *eventsv1.Action) ([]trace, error) {
	want := map[string]string{actionTags[0]: id.GetProject(), actionTags[1]: id.GetDomain(), actionTags[2]: id.GetRun(), actionTags[3]: id.GetAction()}
	tags, err := json.Marshal(want)
	if err != nil {
		return nil, err
	}
	start := a.GetCreatedAt().AsTime().Add(-lookBefore)
	v := url.Values{
		"service": {t.service},
		"tags":    {string(tags)},
		"start":   {strconv.FormatInt(start.UnixMicro(), 10)},
		"end":     {strconv.FormatInt(t.now().UnixMicro(), 10)},
		"limit":   {strconv.Itoa(maxTraces)},
	}
	u := *t.query
	u.RawQuery = v.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking Jaeger for the action's traces: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaeger answered %s", resp.Status)
	}
	out, err := readTraces(&cappedReader{r: resp.Body, left: maxJaegerBytes}, want)
	if err != nil {
		return nil, fmt.Errorf("reading Jaeger's answer (at most %d MiB): %w", maxJaegerBytes>>20, err)
	}
	if t.ui != "" {
		for i := range out {
			out[i].UIURL = t.ui + "/trace/" + out[i].TraceID
		}
	}
	// Newest first: the action's current incarnation leads.
	slices.SortFunc(out, func(a, b trace) int { return cmp.Compare(firstStart(b), firstStart(a)) })
	return out, nil
}

// firstStart is when the trace began: its spans come earliest first.
func firstStart(t trace) int64 {
	if len(t.Spans) == 0 {
		return 0
	}
	return t.Spans[0].Start
}

// writeError answers as a Connect unary error (JSON code and message, the code's HTTP
// status), written by connect's own error writer.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	_ = errorWriter.Write(w, r, err)
}

var errorWriter = connect.NewErrorWriter()

// inProcess hands a client's request to a handler in this process, as if it had come
// over the network, and returns what the handler wrote.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := &recorder{header: http.Header{}}
	t.h.ServeHTTP(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return &http.Response{
		Status: http.StatusText(rec.status), StatusCode: rec.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.header, Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Request: r,
	}, nil
}

type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}
