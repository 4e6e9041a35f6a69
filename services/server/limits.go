package server

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
)

// guard wraps an RPC handler with what must happen before its body is read: the limit
// on calls in progress, the configured middleware (authentication), then the limits on
// in-flight bytes and on stalled writes.
func (s *Server) guard(h http.Handler) http.Handler {
	h = s.limit(h)
	if s.cfg.Middleware != nil {
		h = s.cfg.Middleware(h)
	}
	return s.limitCalls(h)
}

var errTooManyCalls = errors.New("the service has too many calls in progress right now; retry later")

// limitCalls refuses a call when MaxConcurrentCalls are in progress, before anything
// else is spent on it: a stream's goroutine and buffers cost memory even while its client
// sends nothing, and a connection limit alone lets through every stream of every
// connection.
func (s *Server) limitCalls(h http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.calls.TryAcquire(1) {
			_ = errs.Write(w, r, connect.NewError(connect.CodeResourceExhausted, errTooManyCalls))
			return
		}
		defer s.calls.Release(1)
		h.ServeHTTP(w, r)
	})
}

func (s *Server) guardPath(path string, h http.Handler) (string, http.Handler) {
	return path, s.guard(h)
}

// limit counts each request's body bytes against the service's budget, released when
// the call ends, and puts a deadline on every write so a client that stops reading
// cannot park the handler forever.
func (s *Server) limit(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := &countedBody{ReadCloser: r.Body, server: s}
		defer body.release()
		r.Body = body
		h.ServeHTTP(&stallGuard{ResponseWriter: w, rc: http.NewResponseController(w), timeout: s.cfg.WriteStallTimeout}, r)
	})
}

var errTooManyBytes = errors.New("the service holds too many request bytes right now; retry later")

// countedBody takes each chunk it reads from the service's in-flight budget.
type countedBody struct {
	io.ReadCloser
	server *Server

	mu   sync.Mutex
	held int64
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		if !b.server.inFlight.TryAcquire(int64(n)) {
			return 0, connect.NewError(connect.CodeResourceExhausted, errTooManyBytes)
		}
		b.mu.Lock()
		b.held += int64(n)
		b.mu.Unlock()
	}
	return n, err
}

func (b *countedBody) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held > 0 {
		b.server.inFlight.Release(b.held)
		b.held = 0
	}
}

// stallGuard bounds each write and flush of a response. The deadline is cleared after
// each one, so an idle stream (a watch with nothing to say) is not ended.
type stallGuard struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (g *stallGuard) Write(p []byte) (int, error) {
	g.arm()
	defer g.disarm()
	return g.ResponseWriter.Write(p)
}

func (g *stallGuard) Flush() {
	g.arm()
	defer g.disarm()
	_ = g.rc.Flush()
}

func (g *stallGuard) arm() { _ = g.rc.SetWriteDeadline(time.Now().Add(g.timeout)) }

func (g *stallGuard) disarm() { _ = g.rc.SetWriteDeadline(time.Time{}) }

// Unwrap lets http.ResponseController reach the connection's own writer.
func (g *stallGuard) Unwrap() http.ResponseWriter { return g.ResponseWriter }
