package executor_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// apiRecorder sits between an executor and the API server: it counts the requests that
// reach the server by verb and resource ("POST pods", "PUT taskactions/status") and
// injects the faults a test queues.
type apiRecorder struct {
	next   http.RoundTripper
	mu     sync.Mutex
	counts map[string]int
	// succeeded counts the requests of a kind the server accepted (2xx).
	succeeded map[string]int
	faults    map[string][]fault
}

// fault is what happens to one request instead of an ordinary answer.
type fault struct {
	// status answers the request with this HTTP status without forwarding it.
	status int
	// lostReply forwards the request, so the server acts on it, then fails the call as
	// a timed-out connection would: the client never learns that it worked.
	lostReply bool
}

// recordingConfig returns a copy of the test API server's config whose requests pass
// through a new recorder.
func recordingConfig() (*rest.Config, *apiRecorder) {
	rec := &apiRecorder{counts: map[string]int{}, succeeded: map[string]int{}, faults: map[string][]fault{}}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec }
	return cfg, rec
}

// inject queues faults for the next requests of a kind ("POST pods").
func (a *apiRecorder) inject(kind string, faults ...fault) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.faults[kind] = append(a.faults[kind], faults...)
}

// pending is how many of the faults queued for a kind are still to come.
func (a *apiRecorder) pending(kind string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.faults[kind])
}

// count is how many requests of a kind reached the server.
func (a *apiRecorder) count(kind string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counts[kind]
}

// accepted is how many requests of a kind the server accepted.
func (a *apiRecorder) accepted(kind string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.succeeded[kind]
}

// writes is how many write requests to a resource (and its subresources) reached the
// server.
func (a *apiRecorder) writes(resource string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for kind, c := range a.counts {
		method, res, _ := strings.Cut(kind, " ")
		if method != http.MethodGet && (res == resource || strings.HasPrefix(res, resource+"/")) {
			n += c
		}
	}
	return n
}

// writeKinds lists the kinds of write requests to a resource that reached the server,
// with how many of each were accepted, for a failure to say which write was one too many.
func (a *apiRecorder) writeKinds(resource string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var kinds []string
	for kind, c := range a.counts {
		method, res, _ := strings.Cut(kind, " ")
		if method != http.MethodGet && (res == resource || strings.HasPrefix(res, resource+"/")) {
			kinds = append(kinds, fmt.Sprintf("%s: %d (%d accepted)", kind, c, a.succeeded[kind]))
		}
	}
	slices.Sort(kinds)
	return strings.Join(kinds, ", ")
}

func (a *apiRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	kind := r.Method + " " + resourceOf(r.URL.Path)
	a.mu.Lock()
	var f *fault
	if q := a.faults[kind]; len(q) > 0 {
		f, a.faults[kind] = &q[0], q[1:]
	}
	if f == nil || f.status == 0 {
		a.counts[kind]++
	}
	a.mu.Unlock()

	switch {
	case f == nil:
		resp, err := a.next.RoundTrip(r)
		if err == nil && resp.StatusCode/100 == 2 {
			a.mu.Lock()
			a.succeeded[kind]++
			a.mu.Unlock()
		}
		return resp, err
	case f.lostReply:
		resp, err := a.next.RoundTrip(r)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return nil, fmt.Errorf("injected: %w", context.DeadlineExceeded)
	default:
		body := fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected %d","code":%d}`, f.status, f.status)
		return &http.Response{StatusCode: f.status, Status: http.StatusText(f.status), Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": []string{"application/json"}}, Body: io.NopCloser(strings.NewReader(body))}, nil
	}
}

// resourceOf reads the resource and subresource of an API path:
// /api/v1/namespaces/ns/pods/p/status is "pods/status".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+2 < len(parts); i++ {
		if parts[i] == "namespaces" {
			rest := parts[i+2:]
			switch {
			case len(rest) >= 3:
				return rest[0] + "/" + rest[2]
			default:
				return rest[0]
			}
		}
	}
	if len(parts) > 0 {
		return parts[len(parts)-1]
	}
	return ""
}
