// Package healthcheck holds the flags of the images' /healthcheck command
// (deploy/docker/healthcheck), which is a main package: the command parses its arguments
// with them, and deploy's tests parse docker compose's health checks.
package healthcheck

import (
	"flag"
	"time"
)

// Flags registers the command's flags on fs.
func Flags(fs *flag.FlagSet) (timeout *time.Duration, caFile *string) {
	timeout = fs.Duration("timeout", 2*time.Second, "how long to wait for the whole answer")
	caFile = fs.String("cacert", "", "PEM bundle of the CAs trusted for an https URL (default: the system's)")
	return timeout, caFile
}
