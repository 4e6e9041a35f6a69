package app

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flytekube/backend/services/server"
)

// RunFunc serves a service configured by cfg until ctx ends; started, when not nil, is
// called once it accepts calls. cacheservice.Run and events.Run are RunFuncs.
type RunFunc[C any] func(ctx context.Context, cfg C, log *slog.Logger, started func(Addrs)) error

// Main is a service binary's main: it registers the service's flags on the command line
// (flags as cacheservice.Flags), parses them, logs JSON to stderr and runs the service
// until SIGTERM or SIGINT, exiting with status 1 when it fails. "NAME migrate [flags]"
// applies the service's migrations and exits (--migrate=apply-and-exit): the flags
// register MigrateFlags, and run ends at once in that mode.
func Main[C any](name string, flags func(*flag.FlagSet, *C), run RunFunc[C]) {
	var cfg C
	flags(flag.CommandLine, &cfg)
	args := os.Args[1:]
	migrate := len(args) > 0 && args[0] == "migrate"
	if migrate {
		args = args[1:]
	}
	_ = flag.CommandLine.Parse(args) // ExitOnError
	if migrate {
		if err := flag.Set("migrate", string(MigrateAndExit)); err != nil {
			fmt.Fprintf(os.Stderr, "%s migrate: %v\n", name, err)
			os.Exit(2)
		}
	}

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
