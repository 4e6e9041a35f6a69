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
	"github.com/flytekube/backend/services/server"
)

func main() {
	var cfg cacheservice.Config
	cacheservice.Flags(flag.CommandLine, &cfg)
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
