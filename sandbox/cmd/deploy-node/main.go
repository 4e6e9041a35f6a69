// Command deploy-node runs the shipped kustomize deployment on a real node started here
// (package sandbox, Deploy): make deploy-node.
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
	var o sandbox.DeployOptions
	flag.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "how long each rollout, and the examples, may take")
	flag.BoolVar(&o.RollingRestart, "rolling-restart", false, "after the examples, restart each Deployment while actions run, and check no event was lost")
	until := flag.Bool("until-settled", false, "stop once the examples (and the restarts) are checked, instead of running until Ctrl-C")
	flag.Parse()
	o.Hold = !*until
	closeLog, err := sandbox.LogLibrariesTo(filepath.Join(os.TempDir(), "flyte-deploy-node", "libraries.log"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = sandbox.Deploy(ctx, o, os.Stdout)
	stop()
	_ = closeLog()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
