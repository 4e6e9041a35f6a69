// Package server serves Connect services the way every service of this project does: one
// listener speaking Connect, gRPC and gRPC-Web over HTTP/2 (TLS with ALPN when given a
// certificate, h2c otherwise), with reflection (so `buf curl` needs no schema),
// grpc.health.v1, authentication, protovalidate checks and OpenTelemetry on every RPC,
// timeouts and read limits that hold under attack, and a graceful shutdown. It also turns
// what fails into answers that show callers nothing of the inside: a handler's
// unclassified failures, and the database's (DatabaseError).
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"connectrpc.com/otelconnect"
	"connectrpc.com/validate"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"
	"golang.org/x/sync/semaphore"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// Config holds the listener's limits. Zero fields take the defaults of WithDefaults.
type Config struct {
	// Addr is the address to listen on, such as ":8090" or "127.0.0.1:0".
	Addr string
	// ReadHeaderTimeout bounds how long a client may take to send request headers.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle for this long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds request headers.
	MaxHeaderBytes int
	// MaxMessageBytes bounds one request message, compressed or not.
	MaxMessageBytes int
	// MaxConcurrentStreams bounds the HTTP/2 streams one client connection may open.
	MaxConcurrentStreams int
	// MaxConcurrentCalls bounds the calls in progress at once over all connections
	// (health checks aside); more are refused with ResourceExhausted. Each holds a
	// goroutine and its buffers even while its client sends nothing.
	MaxConcurrentCalls int
	// MaxConnections bounds the client connections served at once; more wait to be
	// accepted until one closes.
	MaxConnections int
	// ConnReceiveWindow and StreamReceiveWindow are the HTTP/2 flow-control windows: the
	// request bytes a client may send on one connection, and on one stream, that no
	// handler has read yet. The transport buffers them outside MaxInFlightBytes, at most
	// MaxConnections × ConnReceiveWindow in all.
	ConnReceiveWindow, StreamReceiveWindow int
	// MaxHealthWatches bounds the grpc.health.v1 Watch streams open at once.
	MaxHealthWatches int
	// BodyReadTimeout bounds how long a client may take to send a request body, so a
	// stalled body cannot hold memory or a goroutine.
	BodyReadTimeout time.Duration
	// WriteStallTimeout ends a call whose client stops reading: no single write of a
	// response may take longer.
	WriteStallTimeout time.Duration
	// MaxInFlightBytes bounds the request bytes all calls in progress may hold at once;
	// a call that would exceed it fails with ResourceExhausted. A message is read into a
	// buffer that grows by doubling, so the heap may hold up to twice this.
	MaxInFlightBytes int64
	// TLSCertFile and TLSKeyFile, when set, serve TLS with this PEM certificate and key,
	// re-read when the files change; otherwise the listener speaks h2c.
	TLSCertFile, TLSKeyFile string
	// Middleware, when set, wraps every RPC and reflection handler (not the health
	// checks): authentication, which must run before a request body is read.
	Middleware func(http.Handler) http.Handler
	// Interceptors run on every RPC after validation: authorization.
	Interceptors []connect.Interceptor
	// ShutdownTimeout bounds how long in-flight unary calls may take to finish on shutdown.
	ShutdownTimeout time.Duration
	// StreamDrainDelay is how long open streams are left running after shutdown starts
	// before they are cancelled, so that clients see the health check flip first.
	StreamDrainDelay time.Duration
	// TracerProvider receives the RPCs' spans; nil means the global one.
	TracerProvider trace.TracerProvider
}

// WithDefaults returns the config with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, 10*time.Second)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, 2*time.Minute)
	c.MaxHeaderBytes = cmp.Or(c.MaxHeaderBytes, 64<<10)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, 8<<20)
	c.MaxConcurrentStreams = cmp.Or(c.MaxConcurrentStreams, 100)
	c.MaxConcurrentCalls = cmp.Or(c.MaxConcurrentCalls, 2048)
	c.MaxConnections = cmp.Or(c.MaxConnections, 128)
	c.ConnReceiveWindow = cmp.Or(c.ConnReceiveWindow, 128<<10)
	c.StreamReceiveWindow = cmp.Or(c.StreamReceiveWindow, 64<<10)
	c.MaxHealthWatches = cmp.Or(c.MaxHealthWatches, 8)
	c.BodyReadTimeout = cmp.Or(c.BodyReadTimeout, 30*time.Second)
	c.WriteStallTimeout = cmp.Or(c.WriteStallTimeout, 30*time.Second)
	c.MaxInFlightBytes = cmp.Or(c.MaxInFlightBytes, 16<<20)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 20*time.Second)
	c.StreamDrainDelay = cmp.Or(c.StreamDrainDelay, time.Second)
	return c
}

func (c Config) validate() error {
	if c.Addr == "" {
		return errors.New("server: Addr is required")
	}
	if c.BodyReadTimeout < 0 || c.WriteStallTimeout < 0 || c.ReadHeaderTimeout < 0 || c.IdleTimeout < 0 {
		return errors.New("server: timeouts must be positive (0 takes the default)")
	}
	if c.MaxConcurrentStreams < 0 || c.MaxInFlightBytes < 0 || c.MaxMessageBytes < 0 || c.MaxHeaderBytes < 0 ||
		c.MaxConnections < 0 || c.MaxConcurrentCalls < 0 || c.MaxHealthWatches < 0 {
		return errors.New("server: limits must be positive (0 takes the default)")
	}
	if err := c.validateWindows(); err != nil {
		return err
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("server: tls-cert-file and tls-key-file go together")
	}
	if c.MaxInFlightBytes < int64(c.MaxMessageBytes) {
		return fmt.Errorf("server: MaxInFlightBytes (%d) must hold at least one message (%d)", c.MaxInFlightBytes, c.MaxMessageBytes)
	}
	if c.StreamDrainDelay > c.ShutdownTimeout {
		return fmt.Errorf("server: StreamDrainDelay (%s) must not exceed ShutdownTimeout (%s)", c.StreamDrainDelay, c.ShutdownTimeout)
	}
	return nil
}

// validateWindows refuses windows the HTTP/2 transport would silently replace with its
// own defaults, and a stream window larger than its connection's, which could never fill.
func (c Config) validateWindows() error {
	const minConn, max = 64 << 10, 4 << 20 // what net/http takes
	if c.ConnReceiveWindow < minConn || c.ConnReceiveWindow >= max {
		return fmt.Errorf("server: ConnReceiveWindow (%d) must be at least %d and less than %d", c.ConnReceiveWindow, minConn, max)
	}
	if c.StreamReceiveWindow <= 0 || c.StreamReceiveWindow > c.ConnReceiveWindow {
		return fmt.Errorf("server: StreamReceiveWindow (%d) must be positive and at most ConnReceiveWindow (%d)", c.StreamReceiveWindow, c.ConnReceiveWindow)
	}
	return nil
}

// Server is a Connect server under construction and then running. Register services
// with Handle before Serve.
type Server struct {
	cfg      Config
	log      *slog.Logger
	mux      *http.ServeMux
	names    []string
	health   *grpchealth.StaticChecker
	options  []connect.HandlerOption
	listener net.Listener
	certs    *certwatcher.CertWatcher // nil without TLS
	inFlight *semaphore.Weighted
	calls    *semaphore.Weighted
	watches  *semaphore.Weighted // grpc.health.v1 Watch streams

	// draining is cancelled when shutdown has begun and StreamDrainDelay has passed;
	// it ends the open streams, which would otherwise hold shutdown until its timeout.
	draining   context.Context
	endStreams context.CancelFunc

	mu      sync.Mutex
	serving bool
}

// New creates a server listening on cfg.Addr right away, so that callers (and tests
// using port 0) know the address before serving.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	// Trusting the caller's trace context makes each handler span a child of the
	// caller's span: one trace across the hop.
	otelOpts := []otelconnect.Option{otelconnect.WithTrustRemote()}
	if cfg.TracerProvider != nil {
		otelOpts = append(otelOpts, otelconnect.WithTracerProvider(cfg.TracerProvider))
	}
	otel, err := otelconnect.NewInterceptor(otelOpts...)
	if err != nil {
		return nil, fmt.Errorf("server: creating OpenTelemetry interceptor: %w", err)
	}
	var certs *certwatcher.CertWatcher
	if cfg.TLSCertFile != "" {
		if certs, err = certwatcher.New(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			return nil, fmt.Errorf("server: loading the TLS certificate: %w", err)
		}
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("server: listening on %s: %w", cfg.Addr, err)
	}
	draining, endStreams := context.WithCancel(context.Background())
	s := &Server{
		draining:   draining,
		endStreams: endStreams,
		cfg:        cfg,
		log:        log,
		mux:        http.NewServeMux(),
		health:     grpchealth.NewStaticChecker(),
		listener:   netutil.LimitListener(lis, cfg.MaxConnections),
		certs:      certs,
		inFlight:   semaphore.NewWeighted(cfg.MaxInFlightBytes),
		calls:      semaphore.NewWeighted(int64(cfg.MaxConcurrentCalls)),
		watches:    semaphore.NewWeighted(int64(cfg.MaxHealthWatches)),
		options: []connect.HandlerOption{
			// Tracing first, so that rejected requests still show up as spans, and internal
			// failures are logged with the trace in their context.
			connect.WithInterceptors(append([]connect.Interceptor{
				otel, internalFailures{log}, validate.NewInterceptor(), streamDrainer{draining},
			}, cfg.Interceptors...)...),
			connect.WithReadMaxBytes(cfg.MaxMessageBytes),
			connect.WithCodec(protoCodec{}),
			// Compressing a small response costs more CPU than the bytes it saves on the
			// networks these services run on.
			connect.WithCompressMinBytes(1024),
			connect.WithRecover(recoverPanic),
		},
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	return s, nil
}

// TLSConfig is how the server speaks TLS, for another listener of the same service to
// serve the same certificate (rotated with it while Serve runs); nil without TLS.
func (s *Server) TLSConfig() *tls.Config {
	if s.certs == nil {
		return nil
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.certs.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

// CertificateExpiryMetric is the metric RegisterMetrics registers.
const CertificateExpiryMetric = "flyte_tls_certificate_expiry_timestamp_seconds"

// RegisterMetrics registers the server's own metrics on reg: when the certificate it
// serves stops being valid, read at each scrape (so a rotation shows at once), for an
// alert to fire before a rotation that did not happen leaves every client refusing it.
// Without TLS it registers nothing.
func (s *Server) RegisterMetrics(reg prometheus.Registerer) error {
	if s.certs == nil {
		return nil
	}
	err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: CertificateExpiryMetric,
		Help: "When the TLS certificate the server serves stops being valid (Unix time).",
	}, s.certificateExpiry))
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

// certificateExpiry is the served certificate's NotAfter in Unix seconds; 0 if it
// cannot be read, which an expiry alert takes for expired.
func (s *Server) certificateExpiry() float64 {
	cert, err := s.certs.GetCertificate(nil)
	if err != nil || cert == nil || len(cert.Certificate) == 0 {
		return 0
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return 0
		}
	}
	return float64(leaf.NotAfter.Unix())
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.listener.Addr() }

// Handle registers a service on s. newHandler is the service's generated
// New<Service>Handler, which Handle calls with impl and the server's options: tracing,
// validation, authorization, read limits and panic recovery are the server's to apply,
// never the caller's to remember; opts add to them (KeepUnknownFields). The handler it registers is also authenticated and
// held to the byte and write limits; Handle returns it as registered, for another
// listener of the same service (the events service's console). The service is listed by
// reflection and reported healthy.
//
// Handle is a function because methods take no type parameters, and it has two because
// Go cannot infer an interface from an implementation: it panics, as registering a
// handler twice does, if impl does not implement the service.
func Handle[Service, Impl any](s *Server, impl Impl, newHandler func(Service, ...connect.HandlerOption) (string, http.Handler), opts ...connect.HandlerOption) http.Handler {
	svc, ok := any(impl).(Service)
	if !ok {
		panic(fmt.Sprintf("server: %T does not implement %s", impl, reflect.TypeFor[Service]()))
	}
	path, handler := newHandler(svc, append(slices.Clip(s.options), opts...)...)
	guarded := s.guard(handler)
	s.mux.Handle(path, guarded)
	// Generated paths are "/<fully.qualified.Service>/".
	name := path[1 : len(path)-1]
	s.names = append(s.names, name)
	s.health.SetStatus(name, grpchealth.StatusServing)
	return guarded
}

// Serve serves until ctx is cancelled, then shuts down gracefully: the health check turns
// NOT_SERVING, new connections are refused, in-flight unary calls finish (within
// ShutdownTimeout), and streams are cancelled after StreamDrainDelay.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("server: Serve called twice")
	}
	s.serving = true
	s.mu.Unlock()

	// Health is listed too, so `buf curl` can check it without a schema.
	reflector := grpcreflect.NewStaticReflector(append(slices.Clone(s.names), grpchealth.HealthV1ServiceName)...)
	s.mux.Handle(s.guardPath(grpcreflect.NewHandlerV1(reflector)))
	s.mux.Handle(s.guardPath(grpcreflect.NewHandlerV1Alpha(reflector)))
	s.mux.Handle(s.healthHandler())

	defer s.endStreams()

	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.certs != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	srv := &http.Server{
		Handler:           s.mux,
		Protocols:         &protocols,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		// Over HTTP/2 this is a deadline per stream for its request body; over HTTP/1.1
		// one for the whole request.
		ReadTimeout:    s.cfg.BodyReadTimeout,
		IdleTimeout:    s.cfg.IdleTimeout,
		MaxHeaderBytes: s.cfg.MaxHeaderBytes,
		// What a client sends ahead of the handlers is buffered here: bounded per stream
		// and per connection, and so, with MaxConnections, in all.
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          s.cfg.MaxConcurrentStreams,
			MaxReceiveBufferPerConnection: s.cfg.ConnReceiveWindow,
			MaxReceiveBufferPerStream:     s.cfg.StreamReceiveWindow,
			// The smallest frame: a connection's read buffer grows to its largest frame.
			MaxReadFrameSize: 16 << 10,
		},
		// Requests must not inherit ctx: its cancellation starts a graceful shutdown,
		// which lets in-flight calls finish.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}

	served := make(chan error, 1)
	if s.certs != nil {
		// The watcher re-reads the files when they change, as cert-manager rotates them.
		watchCtx, stopWatching := context.WithCancel(context.WithoutCancel(ctx))
		defer stopWatching()
		go func() { _ = s.certs.Start(watchCtx) }()
		srv.TLSConfig = s.TLSConfig()
		go func() { served <- srv.ServeTLS(s.listener, "", "") }()
	} else {
		go func() { served <- srv.Serve(s.listener) }()
	}
	s.log.Info("serving", "addr", s.Addr().String(), "services", s.names, "tls", s.certs != nil)

	select {
	case err := <-served:
		return fmt.Errorf("server: serving: %w", err)
	case <-ctx.Done():
	}

	s.log.Info("shutting down", "timeout", s.cfg.ShutdownTimeout.String())
	s.health.SetStatus("", grpchealth.StatusNotServing)
	for _, name := range s.names {
		s.health.SetStatus(name, grpchealth.StatusNotServing)
	}
	drain := time.AfterFunc(s.cfg.StreamDrainDelay, s.endStreams)
	defer drain.Stop()

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("server: graceful shutdown: %w", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("server: serving: %w", err)
	}
	return nil
}

// recoverPanic turns a handler panic into an Internal error instead of a dropped
// connection, since input must never crash a server; internalFailures logs it and keeps
// it from the caller.
func recoverPanic(_ context.Context, _ connect.Spec, _ http.Header, p any) error {
	return connect.NewError(connect.CodeInternal, fmt.Errorf("handler panicked: %v", p))
}

// streamDrainer ends server streams when the server drains; unary calls are left to
// finish within the shutdown timeout.
type streamDrainer struct{ draining context.Context }

func (d streamDrainer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (d streamDrainer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (d streamDrainer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(d.draining, cancel)
		defer stop()
		err := next(ctx, conn)
		if err != nil && d.draining.Err() != nil {
			// Unavailable tells clients to reconnect, to another replica or to this one
			// once it is back.
			return connect.NewError(connect.CodeUnavailable, errors.New("server is shutting down"))
		}
		return err
	}
}
