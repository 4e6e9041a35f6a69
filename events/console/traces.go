package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// jaegerTimeout bounds one lookup.
	jaegerTimeout = 10 * time.Second
	// maxJaegerBytes bounds Jaeger's answer; a larger one is refused, not cut.
	maxJaegerBytes = 8 << 20
	// maxTraces bounds the traces asked for: an action deleted and created again under
	// the same names has one per creation.
	maxTraces = 5
	// lookBefore widens the search before the action's first event: the executor's
	// first reconciles come before it.
	lookBefore = 10 * time.Minute
)

var traceIDPattern = regexp.MustCompile(`^[0-9a-f]{16,32}$`)

type traceLookup struct {
	api     eventsv1connect.EventsServiceClient
	query   *url.URL // nil when tracing is not configured
	ui      string
	service string
	client  *http.Client
	now     func() time.Time
}

func newTraceLookup(cfg Config) (*traceLookup, error) {
	t := &traceLookup{
		// The same GetAction the page makes, through the same authentication, so the
		// lookup is allowed exactly when reading the action is.
		api:     eventsv1connect.NewEventsServiceClient(&http.Client{Transport: inProcess{cfg.API}}, "http://in-process"),
		ui:      strings.TrimSuffix(cfg.JaegerUIURL, "/"),
		service: cmp.Or(cfg.JaegerService, "executor"),
		client: &http.Client{
			Timeout: jaegerTimeout,
			// Only the search asked for: a redirect elsewhere is not followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		now: time.Now,
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
}

type trace struct {
	TraceID string `json:"traceId"`
	Spans   []span `json:"spans"`
	UIURL   string `json:"uiUrl,omitempty"`
}

func (t *traceLookup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id := &flytecorev1.ActionIdentifier{Project: q.Get("project"), Domain: q.Get("domain"), Run: q.Get("run"), Action: q.Get("action")}
	if t.query == nil {
		writeError(w, r, connect.NewError(connect.CodeNotFound, errors.New("traces are not shown: the events service has no --jaeger-query-url")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), jaegerTimeout)
	defer cancel()
	req := connect.NewRequest(&eventsv1.GetActionRequest{Id: id})
	if a := r.Header.Get("Authorization"); a != "" {
		req.Header().Set("Authorization", a)
	}
	resp, err := t.api.GetAction(ctx, req)
	if err != nil {
		writeError(w, r, err)
		return
	}
	traces, err := t.search(ctx, id, resp.Msg.GetAction())
	if err != nil {
		writeError(w, r, connect.NewError(connect.CodeUnavailable, err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"traces": traces})
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
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJaegerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading Jaeger's answer: %w", err)
	}
	if len(body) > maxJaegerBytes {
		return nil, fmt.Errorf("jaeger's answer is larger than %d MiB", maxJaegerBytes>>20)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaeger answered %s", resp.Status)
	}
	var found jaegerTraces
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&found); err != nil {
		return nil, fmt.Errorf("reading Jaeger's answer: %w", err)
	}
	out := []trace{}
	for _, jt := range found.Data {
		if !traceIDPattern.MatchString(jt.TraceID) || !jt.names(want) {
			continue
		}
		tr := trace{TraceID: jt.TraceID, Spans: jt.spans()}
		if t.ui != "" {
			tr.UIURL = t.ui + "/trace/" + jt.TraceID
		}
		out = append(out, tr)
	}
	// Newest first: the action's current incarnation leads.
	slices.SortFunc(out, func(a, b trace) int { return cmp.Compare(firstStart(b), firstStart(a)) })
	return out, nil
}

func firstStart(t trace) int64 {
	if len(t.Spans) == 0 {
		return 0
	}
	return slices.MinFunc(t.Spans, func(a, b span) int { return cmp.Compare(a.Start, b.Start) }).Start
}

// jaegerTraces is the part of Jaeger's /api/traces answer the page needs.
type jaegerTraces struct {
	Data []jaegerTrace `json:"data"`
}

type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		StartTime int64       `json:"startTime"`
		Duration  int64       `json:"duration"`
		Tags      []jaegerTag `json:"tags"`
		ProcessID string      `json:"processID"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

func (v jaegerTag) String() string {
	switch x := v.Value.(type) {
	case string:
		return x
	case nil:
		return ""
	default:
		return fmt.Sprint(x)
	}
}

// names reports whether one of the trace's spans carries every one of want's tags: the
// trace is the action's, not only what Jaeger's search matched.
func (jt jaegerTrace) names(want map[string]string) bool {
	for _, s := range jt.Spans {
		n := 0
		for _, tag := range s.Tags {
			if v, ok := want[tag.Key]; ok && tag.String() == v {
				n++
			}
		}
		if n == len(want) {
			return true
		}
	}
	return false
}

func (jt jaegerTrace) spans() []span {
	out := make([]span, 0, len(jt.Spans))
	for _, s := range jt.Spans {
		sp := span{SpanID: s.SpanID, Name: s.OperationName, Start: s.StartTime, Duration: s.Duration,
			Service: jt.Processes[s.ProcessID].ServiceName}
		for _, ref := range s.References {
			if ref.RefType == "CHILD_OF" && ref.TraceID == jt.TraceID {
				sp.ParentID = ref.SpanID
				break
			}
		}
		for _, tag := range s.Tags {
			switch {
			case tag.Key == "error" && tag.String() == "true", tag.Key == "otel.status_code" && tag.String() == "ERROR":
				sp.Error = true
			case strings.HasPrefix(tag.Key, "flyte."), tag.Key == "otel.status_description", tag.Key == "rpc.method":
				if sp.Attributes == nil {
					sp.Attributes = map[string]string{}
				}
				sp.Attributes[tag.Key] = tag.String()
			}
		}
		out = append(out, sp)
	}
	return out
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
