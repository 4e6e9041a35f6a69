// Command sandbox runs the whole system on this machine (see package sandbox): `make run`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/flytekube/backend/sandbox"
)

func main() {
	var o sandbox.Options
	flag.StringVar(&o.Dir, "dir", "", "directory for the sandbox's files (default: $TMPDIR/flyte-sandbox, which the examples name)")
	flag.BoolVar(&o.NoNode, "no-node", false, "use the embedded control plane without a node even as root (container examples are left out)")
	flag.BoolVar(&o.SecondCluster, "second-cluster", false, "start a second cluster beside the first (an embedded control plane and its executor, reporting to the same services) and run the examples marked for it")
	flag.BoolVar(&o.UntilSettled, "until-settled", false, "stop once every example has ended; fail if one did not end as expected")
	flag.DurationVar(&o.Timeout, "timeout", 3*time.Minute, "with --until-settled, how long the examples may take")
	flag.Parse()
	o.Kubeconfig = os.Getenv("KUBECONFIG")
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		o.Terminal = true
	}
	dir := o.Dir
	if dir == "" {
		dir = sandbox.DefaultDir()
	}
	closeLog, err := sandbox.LogLibrariesTo(filepath.Join(dir, "logs", "libraries.log"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = sandbox.Run(ctx, o, os.Stdout)
	stop()
	_ = closeLog()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
