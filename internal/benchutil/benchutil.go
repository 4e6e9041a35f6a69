// Package benchutil holds what the bench commands share: running an operation from
// concurrent clients and summarizing throughput and latency.
package benchutil

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/flytekube/backend/internal/pgtest"
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

// Percentile returns the value below which a fraction p of ds fall.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// Median returns the middle value of xs.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// RunFor calls op from clients goroutines for d and returns what they did; op gets its
// client number and a per-client counter. The first error stops the run.
func RunFor(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context, client, i int) error) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := time.Now().Add(d)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		res   Result
		first error
	)
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			var lat []time.Duration
			for i := 0; time.Now().Before(stop) && ctx.Err() == nil; i++ {
				t := time.Now()
				if err := op(ctx, c, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
					}
					mu.Unlock()
					break
				}
				lat = append(lat, time.Since(t))
			}
			mu.Lock()
			res.Ops += len(lat)
			res.Latencies = append(res.Latencies, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, first
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

// Main runs a bench command's body under an optional CPU profile (written to cpuProfile
// when not empty) and exits with a message naming the command when it fails.
func Main(name, cpuProfile string, body func() error) {
	stop := func() {}
	if cpuProfile != "" {
		var err error
		if stop, err = StartCPUProfile(cpuProfile); err != nil {
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
	pg, err := pgtest.Start()
	if err != nil {
		return err
	}
	defer func() { _ = pg.Stop() }()
	pid, err := pg.PID()
	if err != nil {
		return err
	}
	return f(pg.URL, func(p Proc) bool { return p.PID == pid || p.PPID == pid })
}
