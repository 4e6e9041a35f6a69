// Command executor-bench measures the executor on no-op actions against the envtest
// control plane, beside a plain client's ceiling in the same run, and prints a Markdown
// report (see docs/benchmarks.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/flytekube/backend/executor/bench"
)

func main() {
	var o bench.Options
	flag.IntVar(&o.Actions, "actions", 1000, "actions per scenario")
	flag.IntVar(&o.Creators, "creators", 8, "concurrent clients creating them")
	flag.IntVar(&o.Workers, "workers", 0, "the executor's maxConcurrentReconciles (default: its configured default)")
	flag.Parse()
	if err := bench.Run(context.Background(), o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "executor-bench:", err)
		os.Exit(1)
	}
}
