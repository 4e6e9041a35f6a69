// Command executor runs TaskAction resources through plugins. Its configuration comes
// from the YAML files given by --config, each layered over the ones before it (defaults
// otherwise); the cluster from KUBECONFIG, --kubeconfig, or the in-cluster service
// account. Traces go over OTLP where the standard OTEL_* variables say (nowhere when no
// endpoint is set), as service "executor". An API server that does not answer at start is
// waited for, each try logged, until the executor is stopped or for --api-server-wait.
// --version prints the build and exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/flytekube/backend/executor"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/services/telemetry"
)

func main() {
	configFiles, apiServerWait := executor.Flags(flag.CommandLine)
	buildinfo.Flag(flag.CommandLine, "executor")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	cfg, err := config.LoadFiles(*configFiles...)
	if err != nil {
		log.Error("invalid configuration", "error", err)
		os.Exit(2)
	}
	if err := run(cfg, *apiServerWait, log); err != nil {
		log.Error("executor stopped", "error", err)
		os.Exit(1)
	}
}

func run(cfg config.Config, apiServerWait time.Duration, log *slog.Logger) error {
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("no Kubernetes configuration: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	// The OpenTelemetry metrics (RPC latencies of the cache and events clients) join
	// controller-runtime's on the executor's /metrics.
	tel, err := telemetry.Setup(ctx, "executor", telemetry.WithRegistry(ctrlmetrics.Registry))
	if err != nil {
		return err
	}
	defer func() {
		// Spans still batched are sent before the process exits.
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := tel.Shutdown(shutdownCtx); err != nil {
			log.Warn("flushing telemetry", "error", err)
		}
	}()
	// Setup waits for the API server for as long as its context lasts: until the
	// executor is stopped, or for --api-server-wait.
	setupCtx, endSetup := ctx, context.CancelFunc(func() {})
	if apiServerWait > 0 {
		setupCtx, endSetup = context.WithTimeout(ctx, apiServerWait)
	}
	mgr, err := executor.Setup(setupCtx, cfg, restConfig, log, executor.Options{})
	endSetup()
	if err != nil {
		return fmt.Errorf("setting up: %w", err)
	}
	log.Info("starting executor", "leaderElection", cfg.LeaderElect, "metrics", cfg.MetricsBindAddress, "exportingTraces", tel.Exporting,
		"serviceToken", cfg.ServiceTokenFile != "", "serviceCAFile", cfg.ServiceCAFile, "storagePrefixes", cfg.Storage.AllowedPrefixes)
	return mgr.Start(ctx)
}
