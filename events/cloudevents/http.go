package cloudevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

const (
	// detailBody is how much of a refusing response's body is read for the detail: more
	// than the excerpt shows, so that secrets the receiver echoed are redacted whole
	// before the excerpt is cut.
	detailBody = 2 * MaxExcerpt
	// drainBody is how much more of a response body is read so that the connection can
	// be reused; a longer body costs a new connection instead of an unbounded read.
	drainBody = 64 << 10
)

// httpSink POSTs events to the receiver, one request at a time (the next only after
// the previous one's response, which keeps the order): an event per request in binary
// and structured mode, up to batchSize per request in batched mode.
type httpSink struct {
	name   string
	target string
	// urlSecrets are the parts of target a detail must not show (urlSecrets).
	urlSecrets []string
	mode       Mode
	batchSize  int
	timeout    time.Duration
	tokenFile  string
	client     *http.Client

	mu sync.Mutex // one Publish at a time
}

func openHTTP(c Config) (*httpSink, error) {
	tlsConf, err := tlsConfig(c.caFile)
	if err != nil {
		return nil, err
	}
	if c.tokenFile != "" {
		if _, err := readToken(c.tokenFile); err != nil {
			return nil, err
		}
	}
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: c.timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsConf,
		TLSHandshakeTimeout:   c.timeout,
		ForceAttemptHTTP2:     true, // with a custom TLS configuration, HTTP/2 must be asked for
		MaxIdleConns:          4,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &httpSink{
		name:       c.name,
		target:     c.target.String(),
		urlSecrets: urlSecrets(c.target),
		mode:       c.mode,
		batchSize:  c.batchSize,
		timeout:    c.timeout,
		tokenFile:  c.tokenFile,
		client: &http.Client{
			Transport: transport,
			// A redirect is the receiver's configuration to fix, not something to follow
			// with the events (and a bearer token) to wherever it points.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

func (s *httpSink) Name() string { return s.name }

// String keeps %v from printing the fields (an HTTP receiver's query among them).
func (s *httpSink) String() string { return "cloudevents sink " + s.name }

func (s *httpSink) Close() error {
	s.client.CloseIdleConnections()
	return nil
}

// credentials are what one Publish sends with its requests, and so what its details
// must not show.
type credentials struct {
	token   string // empty: none
	secrets secrets
}

func (s *httpSink) Publish(ctx context.Context, events []event.Event) ([]Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(events) == 0 {
		return nil, nil
	}
	cred := credentials{secrets: s.urlSecrets}
	if s.tokenFile != "" {
		tok, err := readToken(s.tokenFile)
		if err != nil {
			return []Result{retry(err.Error())}, nil
		}
		cred.token = tok
		cred.secrets = append(slices.Clip(cred.secrets), tok)
	}
	if s.mode == Batched {
		return s.publishBatches(ctx, events, cred)
	}
	return s.publishEach(ctx, events, cred)
}

// publishEach sends one event per request.
func (s *httpSink) publishEach(ctx context.Context, events []event.Event, cred credentials) ([]Result, error) {
	results := make([]Result, 0, len(events))
	for i := range events {
		r := s.sendOne(ctx, events[i:i+1], cred)
		if r.Outcome == Retry && ctx.Err() != nil {
			return results, ctx.Err()
		}
		results = append(results, r)
		if r.Outcome == Retry {
			break
		}
	}
	return results, nil
}

// publishBatches sends up to batchSize events per request. A request the receiver
// refuses for good is sent again an event per request, so that only the events it
// refuses go to the dead letters and not their neighbours.
func (s *httpSink) publishBatches(ctx context.Context, events []event.Event, cred credentials) ([]Result, error) {
	results := make([]Result, 0, len(events))
	for start := 0; start < len(events); start += s.batchSize {
		chunk := events[start:min(start+s.batchSize, len(events))]
		r := s.sendOne(ctx, chunk, cred)
		switch {
		case r.Outcome == Delivered:
			for range chunk {
				results = append(results, r)
			}
		case r.Outcome == Retry:
			// Reported for the chunk's first event: nothing after it is delivered.
			if ctx.Err() != nil {
				return results, ctx.Err()
			}
			return append(results, r), nil
		case len(chunk) == 1:
			results = append(results, r)
		default:
			each, err := s.publishEach(ctx, chunk, cred)
			results = append(results, each...)
			if err != nil || len(each) < len(chunk) || each[len(each)-1].Outcome == Retry {
				return results, err
			}
		}
	}
	return results, nil
}

// sendOne makes one request with events (in batched mode a JSON array of them, else
// the one event) and classifies its response. Its detail shows none of cred's secrets.
func (s *httpSink) sendOne(ctx context.Context, events []event.Event, cred credentials) Result {
	outcome, detail := s.roundTrip(ctx, events, cred)
	if outcome == Delivered {
		return delivered()
	}
	return Result{Outcome: outcome, Detail: boundDetail(cred.secrets.redact(detail, false))}
}

// roundTrip makes the request and says what became of it, and why when it failed.
func (s *httpSink) roundTrip(ctx context.Context, events []event.Event, cred credentials) (Outcome, string) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.target, nil)
	if err != nil {
		return Retry, fmt.Sprintf("making the request: %v", err)
	}
	if cred.token != "" {
		req.Header.Set("Authorization", "Bearer "+cred.token)
	}
	if err := s.encode(ctx, req, events); err != nil {
		return Reject, fmt.Sprintf("encoding the event: %v", err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Retry, transportDetail(err, s.timeout)
	}
	head, readErr := io.ReadAll(io.LimitReader(resp.Body, detailBody+1))
	more := len(head) > detailBody
	head = head[:min(len(head), detailBody)]
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBody))
	_ = resp.Body.Close()

	code := resp.StatusCode
	detail := func() string { return fmt.Sprintf("HTTP %d: %s", code, excerpt(head, more, cred.secrets)) }
	switch {
	case code >= 200 && code < 300:
		return Delivered, ""
	case code >= 300 && code < 400:
		return Retry, fmt.Sprintf("HTTP %d: redirects are not followed (Location: %s)", code, redactedLocation(resp.Header.Get("Location")))
	case code == http.StatusTooManyRequests, code == http.StatusRequestTimeout, code >= 500:
		return Retry, detail()
	case code >= 400:
		if readErr != nil && len(head) == 0 {
			return Reject, fmt.Sprintf("HTTP %d (body unreadable: %v)", code, readErr)
		}
		return Reject, detail()
	default:
		return Retry, fmt.Sprintf("HTTP %d: unexpected status", code)
	}
}

// encode writes events into req in the sink's mode.
func (s *httpSink) encode(ctx context.Context, req *http.Request, events []event.Event) error {
	if s.mode != Batched {
		encode := binding.WithForceBinary(ctx)
		if s.mode == Structured {
			encode = binding.WithForceStructured(ctx)
		}
		return cehttp.WriteRequest(encode, binding.ToMessage(&events[0]), req)
	}
	// The body the SDK's NewHTTPRequestFromEvents writes, without its second pass:
	// json.Encoder would validate and compact what each event's MarshalJSON returned.
	var body bytes.Buffer
	body.WriteByte('[')
	for i := range events {
		if err := events[i].Validate(); err != nil {
			return err
		}
		b, err := events[i].MarshalJSON()
		if err != nil {
			return err
		}
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(b)
	}
	body.WriteByte(']')
	req.Header.Set("Content-Type", event.ApplicationCloudEventsBatchJSON)
	req.ContentLength = int64(body.Len())
	buf := body.Bytes()
	req.Body = io.NopCloser(bytes.NewReader(buf))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return nil
}

// transportDetail describes a failed request without its URL, whose query may hold the
// receiver's secrets.
func transportDetail(err error, timeout time.Duration) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("no response within %s", timeout)
	}
	return err.Error()
}

// redactedLocation is a redirect's target without its path and query values.
func redactedLocation(loc string) string {
	u, err := url.Parse(loc)
	if err != nil {
		return "(unparsable)"
	}
	return redactedURL(u)
}
