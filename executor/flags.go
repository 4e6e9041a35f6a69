package executor

import (
	"flag"
	"time"

	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
)

// Flags registers the executor command's flags on fs and returns where --config and
// --api-server-wait are parsed to: the command parses its arguments with them, and
// deploy's tests parse the arguments docker compose and the manifests give it.
// controller-runtime's --kubeconfig is one of them (on flag.CommandLine it is already
// there).
func Flags(fs *flag.FlagSet) (configFile *string, apiServerWait *time.Duration) {
	configFile = fs.String("config", "", "YAML configuration file; the defaults apply when empty")
	apiServerWait = fs.Duration("api-server-wait", 0,
		"how long start-up waits for the Kubernetes API server to answer before the executor exits; 0 waits until it is stopped")
	ctrlconfig.RegisterFlags(fs)
	return configFile, apiServerWait
}
