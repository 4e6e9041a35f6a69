// Package console serves the events service's web console on a listener of its own: the
// page and its script (built from console/ by `make generate`, embedded here), the
// service's read RPCs on the same origin, behind the service's own authentication, and
// an action's traces looked up in Jaeger.
//
// The listener speaks TLS with the service's own certificate when the service has one.
// Without one it speaks plain HTTP, and then only on a loopback address
// (ValidateAddress) and only to requests addressed to one: a bearer token never
// crosses a network in clear, and a page elsewhere cannot reach it by rebinding its
// DNS name to 127.0.0.1 (over TLS the certificate's names stop that).
package console

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/netutil"

	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/server"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console lives on its listener.
const Prefix = "/console/"

// apiPrefix is where the read RPCs are served, under Prefix; the script's Connect
// transport uses it as its base URL.
const apiPrefix = Prefix + "api"

// ContentSecurityPolicy lets the page load only its own script and style sheet and talk
// only to its own origin: no inline script or style, nothing from elsewhere, no framing.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// Config says what the console serves.
type Config struct {
	// API is the events service's Connect handler (eventsv1connect), wrapped in the
	// service's authentication and limits. Only its read procedures are routed to it.
	API http.Handler
	// JaegerQueryURL, when set, is Jaeger's query API (such as http://127.0.0.1:16686),
	// where an action's traces are looked up.
	JaegerQueryURL string
	// JaegerUIURL, when set, is a Jaeger UI the page links each trace to.
	JaegerUIURL string
	// JaegerTimeout bounds one lookup; zero is 10 s.
	JaegerTimeout time.Duration
	// JaegerService is the service whose spans name actions: the executor's.
	JaegerService string
	// TLS says the listener speaks TLS (Serve's tlsConfig is not nil), so requests need
	// not be addressed to a loopback address.
	TLS bool
	// Log receives what goes wrong serving the console.
	Log *slog.Logger
}

// readProcedures are what the console may call: it writes nothing, so Record is not
// routed here, whatever the caller's token may do on the service's own port.
var readProcedures = []string{
	eventsv1connect.EventsServiceGetActionProcedure,
	eventsv1connect.EventsServiceListActionsProcedure,
	eventsv1connect.EventsServiceListActionEventsProcedure,
	eventsv1connect.EventsServiceWatchActionsProcedure,
}

// Handler serves the console.
func Handler(cfg Config) (http.Handler, error) {
	if cfg.API == nil {
		return nil, errors.New("console: API handler is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	files, err := loadAssets()
	if err != nil {
		return nil, err
	}
	traces, err := newTraceLookup(cfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
	mux.Handle("GET "+Prefix+"{$}", files["index.html"])
	for name, h := range files {
		if name != "index.html" {
			mux.Handle("GET "+Prefix+name, h)
		}
	}
	api := http.StripPrefix(apiPrefix, noStore(cfg.API))
	for _, p := range readProcedures {
		mux.Handle(apiPrefix+p, api)
	}
	mux.Handle("GET "+apiPrefix+"/traces", noStore(traces))
	h := securityHeaders(mux)
	if !cfg.TLS {
		h = onlyLoopbackHosts(h)
	}
	return h, nil
}

// loadAssets serves each embedded file with its content type, a strong ETag and
// no-cache, so a browser revalidates (cheaply, with 304) and never runs a stale script
// against a newer service. Each is compressed once, here, and sent compressed to a
// browser that accepts gzip (the script shrinks to about a third).
func loadAssets() (map[string]http.Handler, error) {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	entries, err := fs.ReadDir(sub, ".")
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	files := map[string]http.Handler{}
	for _, e := range entries {
		name := e.Name()
		body, err := fs.ReadFile(sub, name)
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		plain := newRepresentation(body, "")
		gzipped, err := gzipRepresentation(body)
		if err != nil {
			return nil, fmt.Errorf("console: compressing %s: %w", name, err)
		}
		contentType := contentTypes[path.Ext(name)]
		files[name] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Cache-Control", "no-cache")
			h.Set("Vary", "Accept-Encoding")
			if contentType != "" {
				h.Set("Content-Type", contentType)
			}
			rep := plain
			if gzipped != nil && acceptsGzip(r.Header.Values("Accept-Encoding")) {
				rep = *gzipped
				h.Set("Content-Encoding", "gzip")
			}
			h.Set("ETag", rep.etag)
			http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(rep.body))
		})
	}
	if files["index.html"] == nil || files["console.js"] == nil {
		return nil, errors.New("console: the embedded assets lack index.html or console.js: run make generate")
	}
	return files, nil
}

// representation is one encoding of a file, with its own ETag: a cache must not answer
// a request for one encoding with the other.
type representation struct {
	body []byte
	etag string
}

func newRepresentation(body []byte, suffix string) representation {
	sum := sha256.Sum256(body)
	return representation{body: body, etag: `"` + hex.EncodeToString(sum[:12]) + suffix + `"`}
}

// gzipRepresentation compresses body, or returns nil when that saves nothing.
func gzipRepresentation(body []byte) (*representation, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(body); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() >= len(body) {
		return nil, nil
	}
	rep := newRepresentation(buf.Bytes(), "-gzip")
	return &rep, nil
}

// acceptsGzip reads Accept-Encoding headers (RFC 9110, section 12.5.3): gzip is
// accepted when named, or matched by "*", with a weight above zero.
func acceptsGzip(headers []string) bool {
	accepted, wildcard := -1, -1 // -1: not mentioned; 0: refused; 1: accepted
	for _, header := range headers {
		for _, item := range strings.Split(header, ",") {
			coding, params, _ := strings.Cut(item, ";")
			coding = strings.ToLower(strings.TrimSpace(coding))
			if coding != "gzip" && coding != "x-gzip" && coding != "*" {
				continue
			}
			weight := 1
			for _, p := range strings.Split(params, ";") {
				k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "q") {
					if q, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil || q <= 0 {
						weight = 0
					}
				}
			}
			if coding == "*" {
				wildcard = weight
			} else {
				accepted = weight
			}
		}
	}
	if accepted >= 0 {
		return accepted == 1
	}
	return wildcard == 1
}

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// noStore keeps what a token read out of the browser's cache.
func noStore(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// onlyLoopbackHosts refuses requests addressed to another host name, such as a page
// elsewhere that rebinds its DNS name to 127.0.0.1 to read the console with the
// browser's help.
func onlyLoopbackHosts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isLoopbackHost(r.Host) {
			http.Error(w, "the console answers only requests for a loopback address or localhost", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func isLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// MaxConnections bounds the connections the console serves at once: a browser opens a
// few, and each holds buffers and flow-control windows in the events process.
const MaxConnections = 32

// ValidateAddress checks the console's listen address: any address when it speaks
// TLS, a loopback one when it does not (see the package comment).
func ValidateAddress(addr string, encrypted bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console-listen: %w", err)
	}
	if !encrypted && !isLoopbackHost(host) {
		return fmt.Errorf("console-listen: %q is not a loopback address: without a TLS certificate (tls-cert-file) the console speaks plain HTTP, so it listens on 127.0.0.1 (or ::1, localhost)", addr)
	}
	return nil
}

// Serve serves h on lis, over TLS when tlsConfig is not nil, until ctx ends, then
// closes the listener after letting requests in flight finish for a few seconds (the
// service's drain has already ended the streams).
func Serve(ctx context.Context, lis net.Listener, h http.Handler, tlsConfig *tls.Config, log *slog.Logger) error {
	lis = netutil.LimitListener(lis, MaxConnections)
	// The RPC port's flow-control windows: what a client sends ahead of the handler is
	// buffered here, bounded per stream and per connection, and so in all.
	limits := server.Config{}.WithDefaults()
	srv := &http.Server{
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          limits.MaxConcurrentStreams,
			MaxReceiveBufferPerConnection: limits.ConnReceiveWindow,
			MaxReceiveBufferPerStream:     limits.StreamReceiveWindow,
			MaxReadFrameSize:              16 << 10,
		},
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// For HTTP/1.1 this bounds reading the whole request, not writing a stream.
		ReadTimeout:    30 * time.Second,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:    func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		TLSConfig:      tlsConfig,
	}
	served := make(chan error, 1)
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		go func() { served <- srv.ServeTLS(lis, "", "") }()
	} else {
		go func() { served <- srv.Serve(lis) }()
	}
	log.Info("serving the console", "url", scheme+"://"+lis.Addr().String()+Prefix)
	select {
	case err := <-served:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	return nil
}
