// Command events serves flyte.events.v1.EventsService: action events recorded
// idempotently in Postgres, the latest state of each action, and live watches.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/server"
)

func main() {
	var cfg events.Config
	defaults := events.Config{}.WithDefaults()
	flag.StringVar(&cfg.Listen, "listen", ":8090", "address for Connect, gRPC and gRPC-Web")
	flag.StringVar(&cfg.MetricsListen, "metrics-listen", ":9090", "address for Prometheus /metrics; empty disables it")
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
	flag.DurationVar(&cfg.RetentionTTL, "retention-ttl", 0, "delete finished actions and their events this long after they finished; 0 keeps them")
	flag.DurationVar(&cfg.RetentionInterval, "retention-interval", events.Config{}.WithDefaults().RetentionInterval, "how often retention runs")
	flag.IntVar(&cfg.WatchBuffer, "watch-buffer", events.Config{}.WithDefaults().WatchBuffer, "updates queued per watcher before it is ended")
	flag.IntVar(&cfg.MaxWatchers, "max-watchers", defaults.MaxWatchers, "WatchActions streams this replica serves at once; more are refused with ResourceExhausted")
	flag.IntVar(&cfg.MaxWatchersPerIdentity, "max-watchers-per-identity", defaults.MaxWatchersPerIdentity, "WatchActions streams one caller may hold on this replica")
	flag.IntVar(&cfg.MaxResponseBytes, "max-response-bytes", defaults.MaxResponseBytes, "bytes a listing's page may hold; a page ends early, with a token for the next")
	app.SecurityFlags(flag.CommandLine, &cfg.Server, &cfg.Auth)
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	// The TLS certificate watcher logs through controller-runtime's logger.
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	ctx, stop := server.SignalContext(context.Background())
	defer stop()
	if err := events.Run(ctx, cfg, log, nil); err != nil {
		log.Error("events stopped", "error", err)
		os.Exit(1)
	}
}
