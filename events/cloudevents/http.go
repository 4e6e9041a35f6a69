package cloudevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

const (
	// detailBody is how much of a refusing response's body goes into the detail.
	detailBody = 512
	// drainBody is how much more of a response body is read so that the connection can
	// be reused; a longer body costs a new connection instead of an unbounded read.
	drainBody = 64 << 10
)

// httpSink POSTs each event to the receiver, one at a time (the next only after the
// previous one's response, which keeps the order).
type httpSink struct {
	name      string
	target    string
	mode      Mode
	timeout   time.Duration
	tokenFile string
	client    *http.Client

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
		name:      c.name,
		target:    c.target.String(),
		mode:      c.mode,
		timeout:   c.timeout,
		tokenFile: c.tokenFile,
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

func (s *httpSink) Publish(ctx context.Context, events []event.Event) ([]Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(events) == 0 {
		return nil, nil
	}
	var token string
	if s.tokenFile != "" {
		tok, err := readToken(s.tokenFile)
		if err != nil {
			return []Result{retry(err.Error())}, nil
		}
		token = tok
	}
	results := make([]Result, 0, len(events))
	for i := range events {
		r := s.send(ctx, &events[i], token)
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

// send makes one request and classifies its response.
func (s *httpSink) send(ctx context.Context, ev *event.Event, token string) Result {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.target, nil)
	if err != nil {
		return retry(fmt.Sprintf("making the request: %v", err))
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	encode := binding.WithForceBinary(ctx)
	if s.mode == Structured {
		encode = binding.WithForceStructured(ctx)
	}
	if err := cehttp.WriteRequest(encode, binding.ToMessage(ev), req); err != nil {
		return reject(fmt.Sprintf("encoding the event: %v", err))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return retry(transportDetail(err, s.timeout))
	}
	head, readErr := io.ReadAll(io.LimitReader(resp.Body, detailBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBody))
	_ = resp.Body.Close()

	code := resp.StatusCode
	detail := fmt.Sprintf("HTTP %d: %s", code, head)
	switch {
	case code >= 200 && code < 300:
		return delivered()
	case code >= 300 && code < 400:
		return retry(fmt.Sprintf("HTTP %d: redirects are not followed (Location: %s)", code, redactedLocation(resp.Header.Get("Location"))))
	case code == http.StatusTooManyRequests, code == http.StatusRequestTimeout, code >= 500:
		return retry(detail)
	case code >= 400:
		if readErr != nil && len(head) == 0 {
			detail = fmt.Sprintf("HTTP %d (body unreadable: %v)", code, readErr)
		}
		return reject(detail)
	default:
		return retry(fmt.Sprintf("HTTP %d: unexpected status", code))
	}
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

// redactedLocation is a redirect's target without its query values.
func redactedLocation(loc string) string {
	u, err := url.Parse(loc)
	if err != nil {
		return "(unparsable)"
	}
	return redactedURL(u)
}
