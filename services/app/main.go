package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/services/server"
)

// RunFunc serves a service configured by cfg until ctx ends; started, when not nil, is
// called once it accepts calls. cacheservice.Run and events.Run are RunFuncs.
type RunFunc[C any] func(ctx context.Context, cfg C, log *slog.Logger, started func(Addrs)) error

// Main is a service binary's main: it registers the service's flags on the command line
// (flags as cacheservice.Flags) and --version, parses them, logs JSON to stderr and runs
// the service until SIGTERM or SIGINT, exiting with status 1 when it fails. "NAME migrate
// [flags]" applies the service's migrations and exits (--migrate=apply-and-exit): the
// flags register MigrateFlags, and run ends at once in that mode.
func Main[C any](name string, flags func(*flag.FlagSet, *C), run RunFunc[C]) {
	var cfg C
	flags(flag.CommandLine, &cfg)
	buildinfo.Flag(flag.CommandLine, name)
	if err := parseCommandLine(flag.CommandLine, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}

	log := newLogger(os.Stderr)
	ctx, stop := server.SignalContext(context.Background())
	defer stop()
	if err := run(ctx, cfg, log, nil); err != nil {
		log.Error(name+" stopped", "error", err)
		os.Exit(1)
	}
}

// newLogger returns the service's logger, JSON lines on w, and makes it the libraries'
// too: the TLS certificate watcher logs through controller-runtime's logger, and the
// TokenReview and SubjectAccessReview clients (k8s.io/apiserver) through klog, whose own
// plain-text lines would break a log pipeline that reads JSON.
func newLogger(w io.Writer) *slog.Logger {
	log := slog.New(slog.NewJSONHandler(w, nil))
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	klog.SetLogger(logr.FromSlogHandler(log.Handler()))
	return log
}

// parseCommandLine parses a service's command line: flags, or "migrate" and flags, which
// is --migrate=apply-and-exit. It takes no other argument.
func parseCommandLine(fs *flag.FlagSet, args []string) error {
	migrate := len(args) > 0 && args[0] == "migrate"
	if migrate {
		args = args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: the only command is migrate, before the flags", fs.Args())
	}
	if !migrate {
		return nil
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "migrate" })
	if given {
		return errors.New("migrate: --migrate is the serving command's; the migrate command applies the migrations")
	}
	return fs.Set("migrate", string(MigrateAndExit))
}
