// Command executor-bench measures the executor against the envtest control plane — no-op
// and container actions beside a plain client's ceiling in the same run, and the memory
// its informers take in a cluster full of others' pods — and prints a Markdown report
// (see docs/benchmarks.md).
package main

import (
	"context"
	"flag"
	"os"
	"time"

	"github.com/flytekube/backend/bench/benchutil"
	executorbench "github.com/flytekube/backend/bench/executor"
)

func main() {
	var o executorbench.Options
	flag.IntVar(&o.Actions, "actions", 1000, "actions per scenario")
	flag.BoolVar(&o.FinalizerAtAdmission, "finalizer-at-admission", false, "install the component finalizer-at-admission for the executor's scenarios (the API server puts the finalizer on)")
	flag.BoolVar(&o.CeilingRecordsHistory, "ceiling-records-history", false, "the no-op actions' watched ceiling also records each action's history with the events service before its status write (what sparing the finalizer costs at least)")
	flag.IntVar(&o.Creators, "creators", 8, "concurrent clients creating them")
	flag.IntVar(&o.Workers, "workers", 0, "the executor's maxConcurrentReconciles (default: its configured default)")
	flag.IntVar(&o.ContainerActions, "container-actions", 500, "actions in the container scenario")
	flag.IntVar(&o.UnmanagedPods, "unmanaged-pods", 5000, "pods of others in the cluster, for the memory measurement")
	flag.IntVar(&o.ManagedPods, "managed-pods", 1000, "pods of the executor in the cluster, for the memory measurement")
	flag.IntVar(&o.FinishedActions, "finished-actions", 10000, "finished actions in the garbage collection part")
	flag.IntVar(&o.FlatActions, "flat-actions", 50000, "actions in the part that samples what is kept per gone action (five rounds)")
	flag.StringVar(&o.HeapProfiles, "flat-heap-profiles", "", "a directory for a heap profile after each round of the flat part, and of the scale part with the store at its bound (heap-held.pprof) and empty (heap-empty.pprof)")
	flag.IntVar(&o.FairnessBacklog, "fairness-backlog", 5000, "the fan-out of one namespace in the scale part's fairness measurement (0 skips it)")
	flag.Float64Var(&o.ScaleRate, "scale-rate", 100, "actions per second offered in the scale part's sustained load")
	flag.DurationVar(&o.ScaleDuration, "scale-duration", 9*time.Minute, "how long the scale part's sustained load lasts (0 skips it)")
	flag.IntVar(&o.RealNodeActions, "realnode-actions", 100, "container actions in the real-node part")
	flag.StringVar(&o.Only, "only", "", "run one part only: noop, container, gc, memory, flat or scale (not part of a full run), or realnode (a real node, as root; not part of a full run)")
	flag.StringVar(&o.APIServerProfile, "apiserver-cpuprofile", "", "write a CPU profile of the API server, taken over 10 s of the first executor scenario, to this file")
	benchutil.Main("executor-bench", func() error {
		return executorbench.Run(context.Background(), o, os.Stdout, os.Stderr)
	})
}
