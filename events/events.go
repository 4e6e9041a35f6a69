package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/flytekube/backend/events/service"
	"github.com/flytekube/backend/events/store"
	"github.com/flytekube/backend/events/watch"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/services/telemetry"
)

// Config is the events service's configuration; WithDefaults fills the zero fields.
type Config struct {
	// Listen is the RPC address (Connect, gRPC, gRPC-Web).
	Listen string
	// MetricsListen serves /metrics when not empty.
	MetricsListen string
	// DatabaseURL is the Postgres connection URL.
	DatabaseURL string
	// RetentionTTL deletes finished actions and their events this long after they
	// finished; 0 keeps them forever.
	RetentionTTL time.Duration
	// RetentionInterval is how often retention looks for finished actions.
	RetentionInterval time.Duration
	// RetentionBatch bounds the actions deleted per transaction.
	RetentionBatch int
	// WatchBuffer bounds the updates queued for one watcher before it is ended.
	WatchBuffer int
	// Server holds the RPC server's limits; its Addr is taken from Listen.
	Server server.Config
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = ":8090"
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = time.Minute
	}
	if c.RetentionBatch == 0 {
		c.RetentionBatch = 500
	}
	if c.WatchBuffer == 0 {
		c.WatchBuffer = 1024
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("database-url: required (or set DATABASE_URL)")
	case c.RetentionTTL < 0:
		return fmt.Errorf("retention-ttl: must not be negative, got %s", c.RetentionTTL)
	case c.RetentionInterval <= 0:
		return fmt.Errorf("retention-interval: must be positive, got %s", c.RetentionInterval)
	case c.RetentionBatch <= 0:
		return fmt.Errorf("retention-batch: must be positive, got %d", c.RetentionBatch)
	case c.WatchBuffer <= 0:
		return fmt.Errorf("watch-buffer: must be positive, got %d", c.WatchBuffer)
	}
	return nil
}

// Addrs are where a started service listens.
type Addrs struct {
	RPC, Metrics net.Addr
}

// Run migrates the database, then serves until ctx ends and shuts down gracefully:
// calls in flight finish, so every acknowledged event is committed. started, when not
// nil, is called once the service accepts calls.
func Run(ctx context.Context, cfg Config, log *slog.Logger, started func(Addrs)) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("events: config: %w", err)
	}
	tel, err := telemetry.Setup(ctx, "events")
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()

	openCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := postgres.Open(openCtx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	defer pool.Close()
	if _, err := postgres.Migrate(openCtx, pool, store.Migrations(), log); err != nil {
		return fmt.Errorf("events: %w", err)
	}

	metrics, err := service.NewMetrics(tel.Registry)
	if err != nil {
		return err
	}
	st := store.New(pool)
	hub := watch.NewHub(pool, st, cfg.WatchBuffer, log.With("component", "watch"), metrics.Watch())

	srvCfg := cfg.Server
	srvCfg.Addr = cfg.Listen
	srv, err := server.New(srvCfg, log)
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	srv.Handle(eventsv1connect.NewEventsServiceHandler(service.New(st, hub, metrics, log), srv.HandlerOptions()...))

	addrs := Addrs{RPC: srv.Addr()}
	var metricsSrv *http.Server
	if cfg.MetricsListen != "" {
		lis, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("events: metrics listener: %w", err)
		}
		addrs.Metrics = lis.Addr()
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", tel.MetricsHandler())
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = metricsSrv.Serve(lis) }()
		defer func() { _ = metricsSrv.Close() }()
	}

	// The hub and retention stop only after the server has drained, so calls in
	// flight during shutdown still have them.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopBackground()
	bg.Go(func() { _ = hub.Run(bgCtx) })
	if cfg.RetentionTTL > 0 {
		bg.Go(func() { runRetention(bgCtx, st, cfg, log.With("component", "retention")) })
	}

	if started != nil {
		started(addrs)
	}
	return srv.Serve(ctx)
}

// runRetention deletes finished actions older than the TTL, a batch at a time.
func runRetention(ctx context.Context, st *store.Store, cfg Config, log *slog.Logger) {
	ticker := time.NewTicker(cfg.RetentionInterval)
	defer ticker.Stop()
	for {
		total := 0
		for {
			n, err := st.DeleteFinished(ctx, time.Now().Add(-cfg.RetentionTTL), cfg.RetentionBatch)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("deleting finished actions", "error", err)
				}
				break
			}
			total += n
			if n < cfg.RetentionBatch {
				break
			}
		}
		if total > 0 {
			log.Info("deleted finished actions", "actions", total, "ttl", cfg.RetentionTTL)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
