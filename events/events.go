package events

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/kubernetes"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/console"
	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/events/relay"
	"github.com/flytekube/backend/events/service"
	"github.com/flytekube/backend/events/store"
	"github.com/flytekube/backend/events/watch"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/instrument"
	"github.com/flytekube/backend/internal/periodic"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
)

// Config is the events service's configuration; WithDefaults fills the zero fields.
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
	// RetentionTTL deletes finished actions and their events this long after they
	// finished; 0 keeps them forever.
	RetentionTTL time.Duration
	// RetentionUnfinishedTTL deletes an unfinished action and its events once its newest
	// state is this old (its executor is gone, or lost it), when retention reaches its
	// partition; 0 is DefaultUnfinishedTTLFactor times RetentionTTL. Only with a
	// RetentionTTL, and at least RetentionTTL plus PartitionWidth.
	RetentionUnfinishedTTL time.Duration
	// RetentionInterval is how often retention looks for finished actions.
	RetentionInterval time.Duration
	// RetentionBatch bounds the actions deleted (or re-filed) per transaction.
	RetentionBatch int
	// PartitionWidth is the span of filing times one partition of the events table
	// holds (store.DefaultPartitionWidth): retention drops a partition once every action
	// filed in it finished RetentionTTL ago, so history is kept at most this much longer.
	PartitionWidth time.Duration
	// WatchBuffer bounds the updates queued for one watcher before it is ended.
	WatchBuffer int
	// MaxWatchers bounds the WatchActions streams open on this replica.
	MaxWatchers int
	// MaxWatchersPerIdentity bounds the WatchActions streams one caller may hold open
	// on this replica, so one client cannot take every place.
	MaxWatchersPerIdentity int
	// MaxResponseBytes bounds one listing's response: a page ends early, with a token
	// for the next, rather than grow past it (it always holds at least one item).
	MaxResponseBytes int
	// Server holds the RPC server's limits and TLS files; its Addr is taken from Listen.
	Server server.Config
	// Auth says how callers are authenticated; required (mode none must be asked for).
	Auth auth.Config
	// ConsoleListen, when set, serves the web console (events/console) there: over TLS
	// with the service's certificate when Server has one, else plain HTTP on a loopback
	// address only.
	ConsoleListen string
	// ConsolePlaintext serves the console in plain HTTP even though the service has a
	// certificate (a loopback address only): for a browser on the same machine, which
	// would not trust a private CA.
	ConsolePlaintext bool
	// ConsoleListener, when set, serves the console on it instead (tests).
	ConsoleListener net.Listener
	// JaegerQueryURL, when set, is Jaeger's query API, where the console finds an
	// action's traces; JaegerUIURL, when set, a Jaeger UI it links them to.
	JaegerQueryURL, JaegerUIURL string
	// JaegerTimeout bounds one trace lookup; zero is 10 s.
	JaegerTimeout time.Duration
	// CloudEvents says where every recorded event is published as a CloudEvent (its
	// Sinks, from --cloudevents-sink), and how (events/relay).
	CloudEvents relay.Config
	// CloudEventsConfig, when set, is the sinks' configuration file
	// (--cloudevents-config, cloudevents.File): Run adds its sinks to CloudEvents.Sinks.
	CloudEventsConfig string
	// CloudEventsUnregister names sinks taken out of every replica's configuration whose
	// cursors Run deletes at start (--cloudevents-unregister-sink), so that they stop
	// holding the outbox back before the relay forgets them
	// (CloudEvents.ForgetSinksAfter).
	CloudEventsUnregister []string
	// KubeClient, when set, is the API server client of auth mode kubernetes (tests).
	KubeClient kubernetes.Interface
	// TracerProvider, when set, receives the service's spans instead of the provider the
	// OTEL_* variables describe (for tests running several services in one process).
	TracerProvider trace.TracerProvider
}

// minPartitionWidth keeps partitions few: tests use seconds, deployments hours or days.
const minPartitionWidth = time.Second

// minForgetSinksAfter is the shortest time the relay keeps the cursor of a sink no
// replica notes it is configured with: ten of their notes (relay.Config.SinkHeartbeat).
const minForgetSinksAfter = 10 * time.Minute

// minResponseBytes is the smallest response cap: room for a page token beside its items.
const minResponseBytes = 64 << 10

// DefaultMaxMessageBytes bounds a request to the events service. A Record carries up to
// 1,000 events, each of up to about 45 KB as the executor writes them; the executor
// sizes its requests below this (executor/eventsink checks that the numbers agree).
const DefaultMaxMessageBytes = 8 << 20

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = ":8090"
	}
	if c.Server.MaxMessageBytes == 0 {
		c.Server.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = time.Minute
	}
	if c.RetentionBatch == 0 {
		c.RetentionBatch = 5000
	}
	if c.PartitionWidth == 0 {
		c.PartitionWidth = store.DefaultPartitionWidth
	}
	if c.WatchBuffer == 0 {
		c.WatchBuffer = 1024
	}
	if c.MaxWatchers == 0 {
		c.MaxWatchers = 1000
	}
	if c.MaxWatchersPerIdentity == 0 {
		c.MaxWatchersPerIdentity = 100
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 4 << 20
	}
	if c.CloudEvents.ForgetSinksAfter == 0 {
		c.CloudEvents.ForgetSinksAfter = relay.DefaultForgetSinksAfter
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
	case c.RetentionUnfinishedTTL < 0:
		return fmt.Errorf("retention-unfinished-ttl: must not be negative, got %s", c.RetentionUnfinishedTTL)
	case c.RetentionUnfinishedTTL > 0 && c.RetentionTTL == 0:
		return errors.New("retention-unfinished-ttl: needs --retention-ttl: without it nothing is deleted")
	case c.RetentionUnfinishedTTL > 0 && c.RetentionUnfinishedTTL < c.RetentionTTL+c.PartitionWidth:
		return fmt.Errorf("retention-unfinished-ttl: must be at least --retention-ttl plus --partition-width (%s), got %s: an unfinished action must not go before a finished one",
			c.RetentionTTL+c.PartitionWidth, c.RetentionUnfinishedTTL)
	case c.RetentionInterval <= 0:
		return fmt.Errorf("retention-interval: must be positive, got %s", c.RetentionInterval)
	case c.RetentionBatch <= 0:
		return fmt.Errorf("retention-batch: must be positive, got %d", c.RetentionBatch)
	case c.PartitionWidth < minPartitionWidth || c.PartitionWidth%time.Second != 0:
		return fmt.Errorf("partition-width: must be a whole number of seconds, at least %s, got %s", minPartitionWidth, c.PartitionWidth)
	case c.WatchBuffer <= 0:
		return fmt.Errorf("watch-buffer: must be positive, got %d", c.WatchBuffer)
	case c.MaxWatchers <= 0:
		return fmt.Errorf("max-watchers: must be positive, got %d", c.MaxWatchers)
	case c.MaxWatchersPerIdentity <= 0:
		return fmt.Errorf("max-watchers-per-identity: must be positive, got %d", c.MaxWatchersPerIdentity)
	case c.MaxResponseBytes < minResponseBytes:
		return fmt.Errorf("max-response-bytes: must be at least %d, got %d", minResponseBytes, c.MaxResponseBytes)
	}
	if c.CloudEvents.ForgetSinksAfter < minForgetSinksAfter {
		return fmt.Errorf("cloudevents-forget-sink-after: must be at least %s (many of the replicas' notes that they are configured with a sink, a minute apart), got %s",
			minForgetSinksAfter, c.CloudEvents.ForgetSinksAfter)
	}
	names := map[string]bool{}
	for _, sink := range c.CloudEvents.Sinks {
		if names[sink.Name()] {
			return fmt.Errorf("cloudevents: two sinks are named %q: give one a name of its own", sink.Name())
		}
		names[sink.Name()] = true
	}
	for _, name := range c.CloudEventsUnregister {
		if names[name] {
			return fmt.Errorf("cloudevents-unregister-sink: %q is a sink this replica is configured with: take it out of the configuration first", name)
		}
	}
	if c.ConsoleListen != "" {
		if err := console.ValidateAddress(c.ConsoleListen, c.consoleTLS()); err != nil {
			return err
		}
	}
	return c.Auth.WithDefaults().Validate()
}

// consoleTLS says whether the console speaks TLS.
func (c Config) consoleTLS() bool { return c.Server.TLSCertFile != "" && !c.ConsolePlaintext }

// Run migrates the database, then serves until ctx ends and shuts down gracefully:
// calls in flight finish, so every acknowledged event is committed. started, when not
// nil, is called once the service accepts calls.
func Run(ctx context.Context, cfg Config, log *slog.Logger, started func(app.Addrs)) error {
	cfg = cfg.WithDefaults()
	if cfg.Migrate.Mode.Exits() { // the migrate command: the database is all it needs
		if cfg.DatabaseURL == "" {
			return errors.New("events: config: database-url: required (or set DATABASE_URL)")
		}
		return app.Migrate(ctx, cfg.DatabaseURL, store.Migrations(), cfg.Migrate, log)
	}
	if cfg.CloudEventsConfig != "" {
		sinks, err := cloudevents.Load(cfg.CloudEventsConfig)
		if err != nil {
			return fmt.Errorf("events: config: cloudevents-config: %w", err)
		}
		cfg.CloudEvents.Sinks = append(slices.Clip(cfg.CloudEvents.Sinks), sinks...)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("events: config: %w", err)
	}
	appCfg := app.Config{
		Name: "events", Listen: cfg.Listen, MetricsListen: cfg.MetricsListen,
		DatabaseURL: cfg.DatabaseURL, Migrations: store.Migrations(), Migrate: cfg.Migrate, Server: cfg.Server,
		TracerProvider: cfg.TracerProvider, Auth: cfg.Auth, Rules: Rules(), KubeClient: cfg.KubeClient,
	}
	return app.Run(ctx, appCfg, log, func(d app.Deps) ([]app.Background, error) {
		metrics, err := service.NewMetrics(d.Registry)
		if err != nil {
			return nil, err
		}
		st := store.New(d.Pool, store.Options{PartitionWidth: cfg.PartitionWidth, UnfinishedTTL: cfg.RetentionUnfinishedTTL})
		abandoned := instrument.Counter("flyte_events_retention_abandoned_actions_total",
			"Unfinished actions retention deleted with their events, their newest state older than --retention-unfinished-ttl.")
		if err := instrument.Register(d.Registry, abandoned); err != nil {
			return nil, fmt.Errorf("events: registering metrics: %w", err)
		}
		// Before serving, so that Record finds a partition for the present.
		if _, err := st.MaintainPartitions(ctx, time.Now()); err != nil {
			return nil, err
		}
		hub := watch.NewHub(d.Pool, st, watch.Config{
			Buffer: cfg.WatchBuffer, MaxWatchers: cfg.MaxWatchers, MaxWatchersPerIdentity: cfg.MaxWatchersPerIdentity,
		}, log.With("component", "watch"), metrics.Watch())
		svc := service.New(st, hub, metrics, log, service.Options{MaxResponseBytes: cfg.MaxResponseBytes})
		// The service's codec names the field of a string that is not UTF-8, and keeps the
		// fields a newer executor sends that this release does not name: Record stores
		// them with the event, so a rollback or an older replica loses none of them.
		handler := server.Handle(d.Server, svc, eventsv1connect.NewEventsServiceHandler, server.KeepUnknownFields())
		ob := outbox.New(d.Pool)
		// Before serving: every event acknowledged from now on is queued for every sink
		// configured here, even before this replica's relay (or any) leads.
		names := make([]string, len(cfg.CloudEvents.Sinks))
		renames := map[string]string{}
		for i, sink := range cfg.CloudEvents.Sinks {
			names[i] = sink.Name()
			if legacy := sink.LegacyName(); legacy != "" {
				renames[legacy] = sink.Name()
			}
		}
		// An HTTP sink's default name held its URL's path before (a credential, often):
		// what was kept under it moves to the new name, so the sink goes on where it was.
		if cursors, letters, err := ob.RenameSinks(ctx, renames); err != nil {
			return nil, err
		} else if cursors+letters > 0 {
			log.Info("CloudEvents sinks renamed to names without their URL's path", "cursors", cursors, "dead_letters", letters)
		}
		// An operator's explicit step: sinks taken out of every configuration stop holding
		// the outbox back now rather than once the relay forgets them.
		if removed, err := ob.UnregisterSinks(ctx, cfg.CloudEventsUnregister); err != nil {
			return nil, err
		} else if len(removed) > 0 {
			log.Info("CloudEvents sinks unregistered", "sinks", removed)
		}
		if added, err := ob.AddSinks(ctx, names); err != nil {
			return nil, err
		} else if len(added) > 0 {
			log.Info("CloudEvents sinks added", "sinks", added)
		}
		server.Handle(d.Server, service.NewEgress(ob, cfg.CloudEvents.Sinks, log), eventsv1connect.NewEgressServiceHandler)
		relayMetrics, err := relay.NewMetrics(d.Registry, names)
		if err != nil {
			return nil, err
		}
		// It runs even without sinks: its leader unregisters the sinks no replica has been
		// configured with for CloudEvents.ForgetSinksAfter, so that nothing is queued for
		// them any more; a sink it does not know but another replica does keeps its cursor.
		egress := relay.New(ob, cfg.CloudEvents, hub.Nudges(), relayMetrics, log.With("component", "relay"))
		loops := []app.Background{func(ctx context.Context) { _ = hub.Run(ctx) }, egress.Run}
		serveConsole, err := startConsole(cfg, handler, d.Server.TLSConfig(), log)
		if err != nil {
			return nil, err
		}
		if serveConsole != nil {
			loops = append(loops, serveConsole)
		}
		plog := log.With("component", "partitions")
		loops = append(loops, func(ctx context.Context) {
			periodic.Every(ctx, cfg.RetentionInterval, func(ctx context.Context) { maintain(ctx, st, cfg, abandoned, plog) })
		})
		return loops, nil
	}, started)
}

// unfinishedTTL is the effective --retention-unfinished-ttl.
func unfinishedTTL(cfg Config) time.Duration {
	if cfg.RetentionUnfinishedTTL > 0 {
		return cfg.RetentionUnfinishedTTL
	}
	return store.DefaultUnfinishedTTLFactor * cfg.RetentionTTL
}

// startConsole listens for the console, when one is asked for, and returns the loop
// that serves it; it stops after the service has drained, whose streams it shares.
func startConsole(cfg Config, api http.Handler, tlsConfig *tls.Config, log *slog.Logger) (app.Background, error) {
	lis := cfg.ConsoleListener
	if lis == nil && cfg.ConsoleListen == "" {
		return nil, nil
	}
	if cfg.ConsolePlaintext {
		tlsConfig = nil
	}
	h, err := console.Handler(console.Config{
		API: api, JaegerQueryURL: cfg.JaegerQueryURL, JaegerUIURL: cfg.JaegerUIURL, JaegerTimeout: cfg.JaegerTimeout,
		TLS: tlsConfig != nil, Log: log,
	})
	if err != nil {
		return nil, err
	}
	if lis == nil {
		if lis, err = net.Listen("tcp", cfg.ConsoleListen); err != nil {
			return nil, fmt.Errorf("console listener: %w", err)
		}
	}
	return func(ctx context.Context) {
		if err := console.Serve(ctx, lis, h, tlsConfig, log.With("component", "console")); err != nil {
			log.Error("console stopped", "error", err)
		}
	}, nil
}

// maintain makes the partitions ahead and, with a TTL, drops those past it.
func maintain(ctx context.Context, st *store.Store, cfg Config, abandoned prometheus.Counter, log *slog.Logger) {
	now := time.Now()
	made, err := st.MaintainPartitions(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("making partitions", "error", err)
		}
		return
	}
	if len(made) > 0 {
		log.Info("made partitions", "partitions", made)
	}
	if cfg.RetentionTTL == 0 {
		return
	}
	res, err := st.DropExpired(ctx, now, cfg.RetentionTTL, cfg.RetentionBatch)
	if err != nil && ctx.Err() == nil {
		log.Warn("dropping expired partitions", "error", err)
	}
	abandoned.Add(float64(res.Abandoned))
	if res.Abandoned > 0 {
		sample := make([]string, len(res.AbandonedSample))
		for i, k := range res.AbandonedSample {
			sample[i] = k.String()
		}
		log.Warn("deleted unfinished actions whose newest event is older than the retention-unfinished-ttl", "actions", res.Abandoned,
			"first", sample, "unfinished_ttl", unfinishedTTL(cfg).String())
	}
	if res.Partitions+res.Refiled > 0 {
		log.Info("dropped expired partitions", "partitions", res.Partitions, "actions", res.Actions,
			"refiled", res.Refiled, "ttl", cfg.RetentionTTL.String())
	}
}
