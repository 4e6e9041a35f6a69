package executorbench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/test/kubetest"
)

// flatResult is the executor process's live heap and goroutines after each round of
// actions, once all of them were run, delivered and collected: what it keeps per action
// that has gone.
type flatResult struct {
	samples []flatSample
}

type flatSample struct {
	actions    int
	heap       uint64
	goroutines int
}

// runFlat runs rounds of actions through one executor whose collector deletes them as
// soon as they are delivered — mostly no-op sleeps, every fifth a cacheable echo that
// takes a reservation, every twentieth deleted right after it is created — and samples
// the process once each round is gone. The services run in the same process; they too
// must keep nothing per action in memory.
func runFlat(ctx context.Context, env *kubetest.Env, o Options, eventsURL, cacheURL string, progress io.Writer) (flatResult, error) {
	ns := fmt.Sprintf("flat-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, env.Client, ns); err != nil {
		return flatResult{}, err
	}
	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL, cfg.CacheServiceURL = eventsURL, cacheURL
	// Collected a second after they finished: time compressed from the default hour,
	// so that what the executor keeps per action shows within minutes.
	cfg.GC.Interval, cfg.GC.MaxTTL = metav1.Duration{Duration: time.Second}, metav1.Duration{Duration: time.Second}
	cfg.Storage.AllowedPrefixes = []string{"file://" + o.dataDir, "mem://bench/"}
	if o.Workers > 0 {
		cfg.MaxConcurrentReconciles = o.Workers
	}
	restConfig := rest.CopyConfig(env.Config)
	restConfig.QPS, restConfig.Burst = 1000, 2000
	cfg.Namespaces = []string{ns}
	mgr, stop, err := startExecutor(ctx, cfg, restConfig, executor.Options{})
	if err != nil {
		return flatResult{}, err
	}
	defer stop()

	if o.HeapProfiles != "" {
		// Finer than the default 512 KiB, so that tens of bytes per action show.
		runtime.MemProfileRate = 4096
	}
	var r flatResult
	total := 0
	for round, size := range o.flatRounds() {
		_, err := createAll(size, o.Creators, func(i int) (string, time.Time, error) {
			ta, err := flatAction(o, ns, fmt.Sprintf("r%d-a%05d", round, i), i)
			if err == nil {
				err = env.Client.Create(ctx, ta)
			}
			if err == nil && i%20 == 19 {
				err = client.IgnoreNotFound(env.Client.Delete(ctx, ta))
			}
			return ta.Name, time.Now(), err
		})
		if err != nil {
			return r, err
		}
		total += size
		if err := waitCollected(ctx, mgr.GetCache(), ns, 15*time.Minute); err != nil {
			return r, fmt.Errorf("after %d actions: %w", total, err)
		}
		time.Sleep(2 * time.Second) // let the last deletions' handlers and releases run
		s := flatSample{actions: total, heap: benchutil.LiveHeap(), goroutines: runtime.NumGoroutine()}
		r.samples = append(r.samples, s)
		if o.HeapProfiles != "" {
			if err := writeHeapProfile(filepath.Join(o.HeapProfiles, fmt.Sprintf("heap-%d.pprof", total))); err != nil {
				return r, err
			}
		}
		fmt.Fprintf(progress, "flat: %d actions, live heap %.1f MiB, %d goroutines\n", total, mib(s.heap), s.goroutines)
	}
	return r, nil
}

// writeHeapProfile writes the live heap's profile to path, to compare rounds with
// go tool pprof -diff_base.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// flatRounds splits FlatActions into a first round of a fifth (the baseline) and rounds
// of the same size after it.
func (o Options) flatRounds() []int {
	first := max(o.FlatActions/5, 1)
	rounds := []int{first}
	for left := o.FlatActions - first; left > 0; left -= first {
		rounds = append(rounds, min(first, left))
	}
	return rounds
}

func flatAction(o Options, ns, name string, i int) (*flytev1.TaskAction, error) {
	if i%5 != 0 {
		ta := action(ns, name, "core-sleep")
		ta.Spec.Config = map[string]string{"duration": "0s"}
		return ta, nil
	}
	ta := action(ns, name, "core-echo")
	// Outputs on disk: a mem:// store would hold every output in this process's heap.
	ta.Spec.RunOutputBase = "file://" + filepath.Join(o.dataDir, ns, "outputs")
	path := filepath.Join(o.dataDir, ns, name+".json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	ta.Spec.InputURI = "file://" + path
	ta.Spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true}
	return ta, os.WriteFile(path, fmt.Appendf(nil, `{"i": %d}`, i), 0o644)
}

// waitCollected waits until the namespace holds no action: every one ran, was delivered
// and collected, or was deleted.
func waitCollected(ctx context.Context, c client.Reader, ns string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var list flytev1.TaskActionList
		if err := c.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d actions still there after %s (first: %s, %s)", len(list.Items), timeout,
				list.Items[0].Name, list.Items[0].Status.Phase)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (f flatResult) write(w io.Writer) {
	if len(f.samples) == 0 {
		return
	}
	base := f.samples[0]
	fmt.Fprintln(w, "### What the executor keeps per action that has gone")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Live heap (after a collection) and goroutines of the process — the executor, both services — once every action so far ran, was delivered and collected. The first round is the baseline.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| actions so far | live heap (MiB) | × first round | goroutines | × first round |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: |")
	for _, s := range f.samples {
		fmt.Fprintf(w, "| %d | %.1f | %.2f | %d | %.2f |\n", s.actions, mib(s.heap), float64(s.heap)/float64(base.heap),
			s.goroutines, float64(s.goroutines)/float64(base.goroutines))
	}
	fmt.Fprintln(w)
}
