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
	"github.com/flytekube/backend/services/server"
)

func main() {
	var cfg events.Config
	events.Flags(flag.CommandLine, &cfg)
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
