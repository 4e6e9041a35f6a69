package cacheservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/kubernetes"

	"github.com/flytekube/backend/cacheservice/service"
	"github.com/flytekube/backend/cacheservice/store"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/internal/periodic"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
)

// Config is the cache service's configuration; WithDefaults fills the zero fields.
type Config struct {
	// Listen is the RPC address (Connect, gRPC, gRPC-Web).
	Listen string
	// MetricsListen serves /metrics when not empty.
	MetricsListen string
	// DatabaseURL is the Postgres connection URL.
	DatabaseURL string
	// Migrate says whether the service applies its migrations at start, waits for them,
	// or only applies them (the migrate command).
	Migrate app.MigrateConfig
	// MinHeartbeat is the shortest heartbeat interval granted to a reservation; 1s or
	// MaxHeartbeat, whichever is shorter, by default.
	MinHeartbeat time.Duration
	// MaxHeartbeat caps the heartbeat interval of reservations.
	MaxHeartbeat time.Duration
	// HeartbeatGraceMultiplier: a reservation expires after this many heartbeat intervals
	// without one.
	HeartbeatGraceMultiplier int
	// EntryTTL deletes entries this long after they were last written; 0 keeps them.
	EntryTTL time.Duration
	// CleanupInterval is how often expired reservations and old entries are removed.
	CleanupInterval time.Duration
	// CleanupBatch bounds the rows deleted per statement.
	CleanupBatch int
	// ProjectBound bounds every project's cache unless ProjectBounds names the project:
	// past either of its limits the least recently used entries are evicted, on each
	// cleanup pass, down to the bound.
	ProjectBound Bound
	// ProjectBounds are the bounds of projects that have their own.
	ProjectBounds map[string]Bound
	// MaxPendingHits bounds the distinct entries whose hits are held between two cleanup
	// passes, which write them for eviction's order.
	MaxPendingHits int
	// Server holds the RPC server's limits and TLS files; its Addr is taken from Listen.
	Server server.Config
	// Auth says how callers are authenticated; required (mode none must be asked for).
	Auth auth.Config
	// KubeClient, when set, is the API server client of auth mode kubernetes (tests).
	KubeClient kubernetes.Interface
	// TracerProvider, when set, receives the service's spans instead of the provider the
	// OTEL_* variables describe (for tests running several services in one process).
	TracerProvider trace.TracerProvider
}

// Bound limits one project's cache: its entries, and the total size of their outputs
// as the writers told it.
type Bound struct {
	Entries     int64
	OutputBytes int64
}

// Default bounds of a project's cache.
const (
	DefaultMaxEntriesPerProject     = 1_000_000
	DefaultMaxOutputBytesPerProject = 1 << 40 // 1 TiB
)

// DefaultMaxMessageBytes bounds a request to the cache service. Every field of a request
// is bounded, so the largest valid one (a Put) is about 12 KiB; anything much larger is
// padding that only costs the server memory.
const DefaultMaxMessageBytes = 64 << 10

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = ":8094"
	}
	if c.MaxHeartbeat == 0 {
		c.MaxHeartbeat = 10 * time.Second
	}
	if c.MinHeartbeat == 0 {
		c.MinHeartbeat = min(time.Second, c.MaxHeartbeat)
	}
	if c.Server.MaxMessageBytes == 0 {
		c.Server.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.HeartbeatGraceMultiplier == 0 {
		c.HeartbeatGraceMultiplier = 3
	}
	if c.CleanupInterval == 0 {
		c.CleanupInterval = time.Minute
	}
	if c.CleanupBatch == 0 {
		c.CleanupBatch = 1000
	}
	if c.ProjectBound.Entries == 0 {
		c.ProjectBound.Entries = DefaultMaxEntriesPerProject
	}
	if c.ProjectBound.OutputBytes == 0 {
		c.ProjectBound.OutputBytes = DefaultMaxOutputBytesPerProject
	}
	if c.MaxPendingHits == 0 {
		c.MaxPendingHits = 100_000
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("database-url: required (or set DATABASE_URL)")
	case c.MaxHeartbeat <= 0 || c.MaxHeartbeat > time.Hour:
		return fmt.Errorf("max-heartbeat: must be in (0, 1h], got %s", c.MaxHeartbeat)
	case c.MinHeartbeat < time.Millisecond || c.MinHeartbeat > c.MaxHeartbeat:
		return fmt.Errorf("min-heartbeat: must be in [1ms, max-heartbeat (%s)], got %s", c.MaxHeartbeat, c.MinHeartbeat)
	case c.HeartbeatGraceMultiplier < 1:
		return fmt.Errorf("heartbeat-grace-multiplier: must be at least 1, got %d", c.HeartbeatGraceMultiplier)
	case c.EntryTTL < 0:
		return fmt.Errorf("entry-ttl: must not be negative, got %s", c.EntryTTL)
	case c.CleanupInterval <= 0:
		return fmt.Errorf("cleanup-interval: must be positive, got %s", c.CleanupInterval)
	case c.CleanupBatch <= 0:
		return fmt.Errorf("cleanup-batch: must be positive, got %d", c.CleanupBatch)
	case c.ProjectBound.Entries < 0 || c.ProjectBound.OutputBytes < 0:
		return fmt.Errorf("max-entries-per-project and max-output-bytes-per-project: must be positive, got %d and %d",
			c.ProjectBound.Entries, c.ProjectBound.OutputBytes)
	case c.MaxPendingHits < 0:
		return fmt.Errorf("max-pending-hits: must be positive, got %d", c.MaxPendingHits)
	}
	for project, b := range c.ProjectBounds {
		if b.Entries <= 0 || b.OutputBytes <= 0 {
			return fmt.Errorf("project-bound %s: entries and output bytes must be positive, got %d and %d", project, b.Entries, b.OutputBytes)
		}
	}
	return c.Auth.WithDefaults().Validate()
}

// Run migrates the database, then serves until ctx ends and shuts down gracefully.
// started, when not nil, is called once the service accepts calls.
func Run(ctx context.Context, cfg Config, log *slog.Logger, started func(app.Addrs)) error {
	cfg = cfg.WithDefaults()
	if cfg.Migrate.Mode.Exits() { // the migrate command: the database is all it needs
		if cfg.DatabaseURL == "" {
			return errors.New("cacheservice: config: database-url: required (or set DATABASE_URL)")
		}
		return app.Migrate(ctx, cfg.DatabaseURL, store.Migrations(), cfg.Migrate, log)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("cacheservice: config: %w", err)
	}
	appCfg := app.Config{
		Name: "cacheservice", Listen: cfg.Listen, MetricsListen: cfg.MetricsListen,
		DatabaseURL: cfg.DatabaseURL, Migrations: store.Migrations(), Migrate: cfg.Migrate, Server: cfg.Server,
		TracerProvider: cfg.TracerProvider, Auth: cfg.Auth, Rules: Rules(), KubeClient: cfg.KubeClient,
	}
	return app.Run(ctx, appCfg, log, func(d app.Deps) ([]app.Background, error) {
		metrics, err := service.NewMetrics(d.Registry)
		if err != nil {
			return nil, err
		}
		st := store.New(d.Pool)
		res := service.Reservations{MinHeartbeat: cfg.MinHeartbeat, MaxHeartbeat: cfg.MaxHeartbeat, GraceMultiplier: cfg.HeartbeatGraceMultiplier}
		hits := service.NewHits(cfg.MaxPendingHits)
		server.Handle(d.Server, service.New(st, res, metrics, hits, log), cachev1connect.NewCacheServiceHandler)
		clog := log.With("component", "cleanup")
		return []app.Background{func(ctx context.Context) {
			periodic.Every(ctx, cfg.CleanupInterval, func(ctx context.Context) {
				cleanup(ctx, st, cfg, metrics, clog)
				flushHits(ctx, st, hits, metrics, clog)
				evict(ctx, st, cfg, metrics, clog)
			})
		}}, nil
	}, started)
}

// flushHits writes the hits noted since the last pass, so that eviction orders entries
// by their use.
func flushHits(ctx context.Context, st *store.Store, hits *service.Hits, m *service.Metrics, log *slog.Logger) {
	_, dropped, err := hits.Flush(ctx, st)
	m.HitsDropped(dropped)
	if err != nil && ctx.Err() == nil {
		log.Warn("recording hits failed; they are kept for the next pass", "error", err)
	}
}

// evict brings every project past its bound back to it, least recently used entries
// first, unless another replica is doing so.
func evict(ctx context.Context, st *store.Store, cfg Config, m *service.Metrics, log *slog.Logger) {
	_, err := st.WithEvictionLock(ctx, func(ctx context.Context) error {
		usage, err := st.ProjectUsage(ctx)
		if err != nil {
			return err
		}
		for _, u := range usage {
			bound, ok := cfg.ProjectBounds[u.Project]
			if !ok {
				bound = cfg.ProjectBound
			}
			entries, bytes := u.Entries-bound.Entries, u.Bytes-bound.OutputBytes
			var total store.Evicted
			for entries > 0 || bytes > 0 {
				e, err := st.Evict(ctx, u.Project, max(entries, 0), max(bytes, 0), cfg.CleanupBatch)
				if err != nil {
					return err
				}
				m.Evicted(e.Entries, e.Bytes)
				total.Entries, total.Bytes = total.Entries+e.Entries, total.Bytes+e.Bytes
				entries, bytes = entries-e.Entries, bytes-e.Bytes
				if e.Entries == 0 {
					break // what is left is being written; the next pass sees it
				}
			}
			if total.Entries > 0 {
				log.Info("evicted least recently used cache entries", "project", u.Project, "entries", total.Entries,
					"output_bytes", total.Bytes, "bound_entries", bound.Entries, "bound_output_bytes", bound.OutputBytes)
			}
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		log.Warn("eviction failed", "error", err)
	}
}

// cleanup removes expired reservations and, with a TTL, old entries, a batch at a time.
func cleanup(ctx context.Context, st *store.Store, cfg Config, m *service.Metrics, log *slog.Logger) {
	drain := func(kind string, del func() (int64, error)) {
		for {
			n, err := del()
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("cleanup failed", "kind", kind, "error", err)
				}
				return
			}
			m.Cleaned(kind, n)
			if n < int64(cfg.CleanupBatch) {
				return
			}
		}
	}
	drain("reservation", func() (int64, error) { return st.DeleteExpiredReservations(ctx, cfg.CleanupBatch) })
	if cfg.EntryTTL > 0 {
		drain("entry", func() (int64, error) {
			return st.DeleteOldEntries(ctx, time.Now().Add(-cfg.EntryTTL), cfg.CleanupBatch)
		})
	}
}
