package executor

import (
	"flag"
	"strings"
	"time"

	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
)

// Flags registers the executor command's flags on fs and returns where --config and
// --api-server-wait are parsed to: the command parses its arguments with them, and
// deploy's tests parse the arguments docker compose and the manifests give it.
// controller-runtime's --kubeconfig is one of them (on flag.CommandLine it is already
// there).
func Flags(fs *flag.FlagSet) (configFiles *ConfigFiles, apiServerWait *time.Duration) {
	configFiles = new(ConfigFiles)
	fs.Var(configFiles, "config", "YAML configuration `file`; may be repeated, each file layered over the ones before it; "+
		"the defaults apply when none is given")
	apiServerWait = fs.Duration("api-server-wait", 0,
		"how long start-up waits for the Kubernetes API server to answer before the executor exits; 0 waits until it is stopped")
	ctrlconfig.RegisterFlags(fs)
	return configFiles, apiServerWait
}

// ConfigFiles is the repeatable --config flag: the paths given, in order, for
// config.LoadFiles to layer. Each value is one path, not split on commas, since a path
// may hold one.
type ConfigFiles []string

// String joins the paths with commas, for display only.
func (c *ConfigFiles) String() string {
	if c == nil {
		return ""
	}
	return strings.Join(*c, ",")
}

// Set adds a path after those already given.
func (c *ConfigFiles) Set(path string) error {
	*c = append(*c, path)
	return nil
}
