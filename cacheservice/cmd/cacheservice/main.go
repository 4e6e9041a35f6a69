// Command cacheservice serves flyte.cache.v1.CacheService: memoized task outputs and the
// reservations that keep identical tasks from running at once, in Postgres.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/server"
)

func main() {
	defaults := cacheservice.Config{}.WithDefaults()
	var cfg cacheservice.Config
	flag.StringVar(&cfg.Listen, "listen", defaults.Listen, "address for Connect, gRPC and gRPC-Web")
	flag.StringVar(&cfg.MetricsListen, "metrics-listen", ":9094", "address for Prometheus /metrics; empty disables it")
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
	flag.DurationVar(&cfg.MaxHeartbeat, "max-heartbeat", defaults.MaxHeartbeat, "longest heartbeat interval granted to a reservation")
	flag.DurationVar(&cfg.MinHeartbeat, "min-heartbeat", defaults.MinHeartbeat, "shortest heartbeat interval granted to a reservation, whatever a caller asks for")
	flag.IntVar(&cfg.HeartbeatGraceMultiplier, "heartbeat-grace-multiplier", defaults.HeartbeatGraceMultiplier, "a reservation expires after this many heartbeat intervals without one")
	flag.DurationVar(&cfg.EntryTTL, "entry-ttl", 0, "delete entries this long after they were last written; 0 keeps them")
	flag.DurationVar(&cfg.CleanupInterval, "cleanup-interval", defaults.CleanupInterval, "how often expired reservations and old entries are removed")
	app.SecurityFlags(flag.CommandLine, &cfg.Server, &cfg.Auth)
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	// The TLS certificate watcher logs through controller-runtime's logger.
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	ctx, stop := server.SignalContext(context.Background())
	defer stop()
	if err := cacheservice.Run(ctx, cfg, log, nil); err != nil {
		log.Error("cacheservice stopped", "error", err)
		os.Exit(1)
	}
}
