// Command executor runs TaskAction resources through plugins. Its configuration comes
// from the YAML file given by --config (defaults otherwise); the cluster from KUBECONFIG,
// --kubeconfig, or the in-cluster service account.
package main

import (
	"flag"
	"log/slog"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/flytekube/backend/executor"
	"github.com/flytekube/backend/executor/config"
)

func main() {
	configPath := flag.String("config", "", "YAML configuration file; the defaults apply when empty")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	cfg, err := config.Load(*configPath)
	if err != nil {
		log.Error("invalid configuration", "error", err)
		os.Exit(2)
	}
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		log.Error("no Kubernetes configuration", "error", err)
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	mgr, err := executor.Setup(ctx, cfg, restConfig, log, executor.Hooks{})
	if err != nil {
		log.Error("setting up", "error", err)
		os.Exit(1)
	}
	log.Info("starting executor", "leaderElection", cfg.LeaderElect, "metrics", cfg.MetricsBindAddress)
	if err := mgr.Start(ctx); err != nil {
		log.Error("executor stopped", "error", err)
		os.Exit(1)
	}
}
