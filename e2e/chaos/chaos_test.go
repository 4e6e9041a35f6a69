package chaos

import (
	"cmp"
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/systemtest"
)

var (
	seedFlag     = flag.Uint64("seed", 0, "seed of the soak (default $SEED, else random)")
	durationFlag = flag.Duration("duration", 0, "how long faults fire (default $DURATION, else 30s)")
)

// TestChaos is the seeded chaos soak: a short run by default, as part of make test;
// make chaos SEED=… DURATION=30m runs long.
func TestChaos(t *testing.T) {
	seed, duration := options(t)
	assets, err := kubetest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	// Short, for Postgres's socket path, which must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d, duration %s, files in %s", seed, duration, dir)
	admission := os.Getenv("CHAOS_ADMISSION") != ""
	replay := "replay: CHAOS_NODE=" + cmp.Or(os.Getenv("CHAOS_NODE"), systemtest.NodeStandIn) + " CHAOS_ADMISSION=" + os.Getenv("CHAOS_ADMISSION") + " SEED=" + strconv.FormatUint(seed, 10) + " DURATION=" + duration.String() + " go test ./e2e/chaos -run TestChaos -v -timeout " + (duration + 15*time.Minute).String()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), duration+10*time.Minute)
	defer cancel()
	node := os.Getenv("CHAOS_NODE")
	if node == systemtest.NodeReal && os.Geteuid() != 0 {
		t.Fatal("CHAOS_NODE=real: a real node needs root (containerd, kubelet)")
	}
	t.Logf("pods run on the %s node", cmp.Or(node, systemtest.NodeStandIn))
	rep, err := Run(ctx, Options{Seed: seed, Duration: duration, Dir: dir, Assets: assets, Node: node, FinalizerAtAdmission: admission,
		Log: func(format string, args ...any) {
			t.Logf("%5.1fs "+format, append([]any{time.Since(began).Seconds()}, args...)...)
		}})
	if err != nil {
		t.Fatalf("seed %d: the soak could not run: %v\n%s", seed, err, replay)
	}
	t.Logf("seed %d, %s: %d actions (%d deleted by the client), %d of the hostile tenant, %s; pods run to their end: %v",
		seed, duration, rep.Actions, rep.Deleted, rep.Hostile, rep.FaultSummary(), rep.PodsRun)
	t.Logf("the hostile tenant's actions ended: %s", strings.Join(rep.HostileEnds, "; "))
	t.Logf("observed: %s", rep.Observed)
	if len(rep.Problems) > 0 {
		t.Errorf("seed %d: %d problems:\n  %s\nlogs in %s\n%s", seed, len(rep.Problems), strings.Join(rep.Problems, "\n  "),
			filepath.Join(dir, "logs"), replay)
		return
	}
	_ = os.RemoveAll(dir)
}

// defaultSeed is the short run's plan.
const defaultSeed = 1

// options reads the seed and the duration from the flags, else SEED and DURATION.
func options(t *testing.T) (uint64, time.Duration) {
	seed, duration := *seedFlag, *durationFlag
	if seed == 0 {
		// Without a seed the short run of make test plays one plan, the same each time, so
		// that a red CI run is a change of the tree, not a new draw; SEED=random draws.
		switch v := os.Getenv("SEED"); v {
		case "":
			seed = defaultSeed
		case "random":
			seed = rand.Uint64N(1 << 32)
		default:
			var err error
			if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
				t.Fatalf("SEED=%q: %v", v, err)
			}
		}
	}
	if duration == 0 {
		duration = 30 * time.Second
		if v := os.Getenv("DURATION"); v != "" {
			var err error
			if duration, err = time.ParseDuration(v); err != nil {
				t.Fatalf("DURATION=%q: %v", v, err)
			}
		}
	}
	return seed, duration
}
