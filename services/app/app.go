// Package app runs a Postgres-backed Connect service the way every service of this project
// runs: telemetry from the environment, the database opened and migrated, handlers served
// through the server runtime, Prometheus metrics on their own listener, background loops
// that outlive the drain, and a graceful shutdown.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/kubernetes"

	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/services/telemetry"
)

// Config says what to run.
type Config struct {
	// Name names the service in traces and logs.
	Name string
	// Listen is the RPC address.
	Listen string
	// MetricsListen serves /metrics when not empty.
	MetricsListen string
	// DatabaseURL is the Postgres connection URL.
	DatabaseURL string
	// Migrations are the service's; Migrate says whether it applies them at start or
	// waits for them.
	Migrations postgres.Migrations
	Migrate    MigrateConfig
	// Server holds the RPC server's limits and TLS files; its Addr is taken from Listen.
	Server server.Config
	// Auth says how callers are authenticated and authorized; Rules say what each RPC
	// needs.
	Auth  auth.Config
	Rules auth.Rules
	// KubeClient, when set, is the API server client of auth mode kubernetes (tests);
	// otherwise Auth.Kubeconfig or the in-cluster configuration is used.
	KubeClient kubernetes.Interface
	// TracerProvider, when set, receives the service's spans (RPCs and SQL) instead of
	// the provider the OTEL_* variables describe, which is then not installed: tests
	// running several services in one process give each its own.
	TracerProvider trace.TracerProvider
}

// Deps is what a service builds its handlers from.
type Deps struct {
	Pool     *pgxpool.Pool
	Server   *server.Server
	Registry prometheus.Registerer
	Log      *slog.Logger
}

// Background is a loop that runs until its context ends. Loops stop only after the
// server has drained, so calls in flight during shutdown still have them.
type Background func(ctx context.Context)

// Setup registers the service's handlers on deps.Server and returns its loops.
type Setup func(deps Deps) ([]Background, error)

// Addrs are where a started service listens.
type Addrs struct {
	RPC, Metrics net.Addr
}

// Run serves until ctx ends, then shuts down gracefully. started, when not nil, is called
// once the service accepts calls.
func Run(ctx context.Context, cfg Config, log *slog.Logger, setup Setup, started func(Addrs)) error {
	var telOpts []telemetry.Option
	if cfg.TracerProvider != nil {
		telOpts = append(telOpts, telemetry.WithTracerProvider(cfg.TracerProvider))
	}
	tel, err := telemetry.Setup(ctx, cfg.Name, telOpts...)
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()

	// Authentication is settled first: a service that could not check its callers must
	// not start at all.
	guard, err := auth.New(cfg.Auth, cfg.KubeClient, tel.Registry, log)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}

	openCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := postgres.Open(openCtx, cfg.DatabaseURL, postgres.WithTracerProvider(tel.TracerProvider))
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}
	defer pool.Close()
	// No time limit: the runner bounds its own retries, and a service waiting for its
	// migrations is not ready, not failed, until they are applied.
	if err := prepareSchema(ctx, pool, cfg.Migrations, cfg.Migrate, log); err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}

	srvCfg := cfg.Server
	srvCfg.Addr = cfg.Listen
	srvCfg.TracerProvider = tel.TracerProvider
	srvCfg.Middleware = guard.Middleware
	srvCfg.Interceptors = append(srvCfg.Interceptors, guard.Interceptor(cfg.Rules))
	srv, err := server.New(srvCfg, log)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}
	if err := srv.RegisterMetrics(tel.Registry); err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}
	loops, err := setup(Deps{Pool: pool, Server: srv, Registry: tel.Registry, Log: log})
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.Name, err)
	}

	addrs := Addrs{RPC: srv.Addr()}
	if cfg.MetricsListen != "" {
		lis, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("%s: metrics listener: %w", cfg.Name, err)
		}
		addrs.Metrics = lis.Addr()
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", tel.MetricsHandler())
		metricsSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = metricsSrv.Serve(lis) }()
		defer func() { _ = metricsSrv.Close() }()
	}

	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopBackground()
	for _, loop := range loops {
		bg.Go(func() { loop(bgCtx) })
	}

	if started != nil {
		started(addrs)
	}
	return srv.Serve(ctx)
}
