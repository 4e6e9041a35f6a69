// Package benchutil holds what the bench commands share: running an operation from
// concurrent clients and summarizing throughput and latency.
package benchutil

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"gonum.org/v1/gonum/stat"
)

// Result is what a run measured.
type Result struct {
	Ops       int
	Elapsed   time.Duration
	Latencies []time.Duration
}

// PerSecond is the throughput.
func (r Result) PerSecond() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

// Percentile returns the latency below which a fraction p of the operations fell.
func (r Result) Percentile(p float64) time.Duration { return Percentile(r.Latencies, p) }

// Percentile returns the smallest of ds that at least a fraction p of ds do not exceed.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d)
	}
	return time.Duration(quantile(p, xs))
}

// Median returns the middle value of xs (the lower of the two middle ones when there is
// an even number).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return quantile(0.5, slices.Clone(xs))
}

// quantile sorts xs and returns its p-quantile, a value of xs.
func quantile(p float64, xs []float64) float64 {
	slices.Sort(xs)
	return stat.Quantile(p, stat.Empirical, xs, nil)
}

// RunFor calls op from clients goroutines for d and returns what they did; op gets its
// client number and a per-client counter. The first error stops the run.
func RunFor(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context, client, i int) error) (Result, error) {
	g, ctx := errgroup.WithContext(ctx)
	stop := time.Now().Add(d)
	var (
		mu  sync.Mutex
		res Result
	)
	start := time.Now()
	for c := range clients {
		g.Go(func() error {
			var lat []time.Duration
			defer func() {
				mu.Lock()
				res.Ops += len(lat)
				res.Latencies = append(res.Latencies, lat...)
				mu.Unlock()
			}()
			for i := 0; time.Now().Before(stop) && ctx.Err() == nil; i++ {
				t := time.Now()
				if err := op(ctx, c, i); err != nil {
					return err
				}
				lat = append(lat, time.Since(t))
			}
			return nil
		})
	}
	err := g.Wait()
	res.Elapsed = time.Since(start)
	return res, err
}

// StartCPUProfile writes a CPU profile to path until the returned stop is called.
func StartCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// Main is a bench command's main: it parses the command line, with a --cpuprofile flag
// beside the command's own, runs body under the CPU profile asked for, and exits with a
// message naming the command when body fails.
func Main(name string, body func() error) {
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (everything in this process) to this file")
	flag.Parse()
	stop := func() {}
	if *cpuProfile != "" {
		var err error
		if stop, err = StartCPUProfile(*cpuProfile); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
	}
	err := body()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// WithDatabase calls f with url, or, when url is empty, with a throwaway Postgres
// cluster's that is removed afterwards. postgres chooses the processes of that cluster
// (the postmaster and its backends), for CPU accounting; it is nil when url was given.
func WithDatabase(url string, f func(url string, postgres func(Proc) bool) error) error {
	if url != "" {
		return f(url, nil)
	}
	pg, err := StartPostgres()
	if err != nil {
		return err
	}
	defer func() { _ = pg.Stop() }()
	return f(pg.URL, pg.Procs)
}
