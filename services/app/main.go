package app

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/services/server"
)

// RunFunc serves a service configured by cfg until ctx ends; started, when not nil, is
// called once it accepts calls. cacheservice.Run and events.Run are RunFuncs.
type RunFunc[C any] func(ctx context.Context, cfg C, log *slog.Logger, started func(Addrs)) error

// Main is a service binary's main: it registers the service's flags on the command line
// (flags as cacheservice.Flags) and --version, parses them, logs JSON to stderr and runs
// the service until SIGTERM or SIGINT, exiting with status 1 when it fails.
func Main[C any](name string, flags func(*flag.FlagSet, *C), run RunFunc[C]) {
	var cfg C
	flags(flag.CommandLine, &cfg)
	buildinfo.Flag(flag.CommandLine, name)
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	// The TLS certificate watcher logs through controller-runtime's logger.
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	ctx, stop := server.SignalContext(context.Background())
	defer stop()
	if err := run(ctx, cfg, log, nil); err != nil {
		log.Error(name+" stopped", "error", err)
		os.Exit(1)
	}
}
