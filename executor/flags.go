package executor

import (
	"flag"

	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
)

// Flags registers the executor command's flags on fs and returns where --config is
// parsed to: the command parses its arguments with them, and deploy's tests parse the
// arguments docker compose and the manifests give it. controller-runtime's --kubeconfig
// is one of them (on flag.CommandLine it is already there).
func Flags(fs *flag.FlagSet) (configFile *string) {
	configFile = fs.String("config", "", "YAML configuration file; the defaults apply when empty")
	ctrlconfig.RegisterFlags(fs)
	return configFile
}
