package cachebench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flytekube/backend/bench/benchutil"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

// The paths part measures what one cacheable action costs the cache service and its
// database, the way a serializable action calls it: a miss that computes the key, then
// a hit by an identical action. The four-call path is the one of the first contract (and
// upstream's): Get, GetOrExtendReservation, Put, ReleaseReservation for the miss, Get
// for the hit. The two-call path: LookupOrReserve and PutAndRelease for the miss,
// LookupOrReserve for the hit. Rounds alternate between them, on fresh keys, and each
// ratio is the median of the rounds' ratios.

// PathStats is one path's figures, medians over rounds.
type PathStats struct {
	Name string
	// Pairs per second (a miss and its hit), RPCs per pair.
	PairsPerSecond, RPCsPerPair float64
	// CPU per pair, by process group (this process: the service and its clients;
	// Postgres, when the bench started it).
	CPU benchutil.CPUUse
	// Miss and hit latencies of the last round.
	Miss, Hit benchutil.Result
}

// PathsResult compares the two paths.
type PathsResult struct {
	Four, Two PathStats
	// CPURatio and ServerCPURatio are the medians of the rounds' ratios of the two-call
	// path's CPU per pair to the four-call path's: all measured, and Postgres alone.
	CPURatio, PostgresRatio float64
	HavePostgres            bool
}

// cachePath runs one cacheable action's miss and then its identical twin's hit.
type cachePath struct {
	name      string
	miss, hit func(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner string) error
}

var source = &flytecorev1.ActionIdentifier{Project: "bench", Domain: "development", Run: "r", Action: "a"}

func putReq(k *cachev1.CacheKey) *cachev1.PutRequest {
	return &cachev1.PutRequest{Key: k, OutputUri: "s3://bench/outputs/" + k.GetInputsHash(), SourceAction: source, SourceAttempt: 1, Overwrite: true, OutputBytes: 1024}
}

var hb = durationpb.New(5 * time.Second)

var fourCalls = cachePath{
	name: "four calls: Get, GetOrExtendReservation, Put, ReleaseReservation; Get",
	miss: func(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner string) error {
		if _, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k})); connect.CodeOf(err) != connect.CodeNotFound {
			return fmt.Errorf("the miss's Get: %v", err)
		}
		res, err := c.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{Key: k, OwnerId: owner, HeartbeatInterval: hb}))
		if err != nil || !res.Msg.GetAcquired() {
			return fmt.Errorf("reserving: acquired %v, %v", res.Msg.GetAcquired(), err)
		}
		if _, err := c.Put(ctx, connect.NewRequest(putReq(k))); err != nil {
			return err
		}
		_, err = c.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: k, OwnerId: owner}))
		return err
	},
	hit: func(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, _ string) error {
		_, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k}))
		return err
	},
}

var twoCalls = cachePath{
	name: "two calls: LookupOrReserve, PutAndRelease; LookupOrReserve",
	miss: func(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner string) error {
		res, err := c.LookupOrReserve(ctx, connect.NewRequest(&cachev1.LookupOrReserveRequest{Key: k, OwnerId: owner, HeartbeatInterval: hb, Action: source}))
		if err != nil || !res.Msg.GetAcquired() {
			return fmt.Errorf("the miss's lookup: acquired %v, %v", res.Msg.GetAcquired(), err)
		}
		_, err = c.PutAndRelease(ctx, connect.NewRequest(&cachev1.PutAndReleaseRequest{Put: putReq(k), OwnerId: owner}))
		return err
	},
	hit: func(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner string) error {
		res, err := c.LookupOrReserve(ctx, connect.NewRequest(&cachev1.LookupOrReserveRequest{Key: k, OwnerId: owner, HeartbeatInterval: hb, Action: source}))
		if err == nil && res.Msg.GetOutput() == nil {
			err = fmt.Errorf("the hit's lookup found no entry")
		}
		return err
	},
}

// countingClients are clients whose calls are counted.
func countingClients(h []*http.Client, url string, calls *atomic.Int64) []cachev1connect.CacheServiceClient {
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			calls.Add(1)
			return next(ctx, req)
		}
	})
	out := make([]cachev1connect.CacheServiceClient, len(h))
	for i, c := range h {
		out[i] = cachev1connect.NewCacheServiceClient(c, url, connect.WithInterceptors(count))
	}
	return out
}

// measurePaths runs the paths part against the service at url.
func measurePaths(ctx context.Context, o Options, httpClients []*http.Client, url string, progress io.Writer) (PathsResult, error) {
	var calls atomic.Int64
	clients := countingClients(httpClients[:o.Clients], url, &calls)
	meter := benchutil.CPUMeter{Groups: map[string]func(benchutil.Proc) bool{}}
	if o.Postgres != nil {
		meter.Groups["Postgres"] = o.Postgres
	}
	type round struct {
		pairs     int
		rpcs      float64
		cpu       benchutil.CPUUse
		perSecond float64
		miss, hit benchutil.Result
	}
	run := func(p cachePath, n int) (round, error) {
		calls.Store(0)
		misses := make([][]time.Duration, o.Clients)
		hits := make([][]time.Duration, o.Clients)
		var res benchutil.Result
		cpu, err := meter.Measure(func() error {
			var err error
			res, err = benchutil.RunFor(ctx, o.Clients, o.Duration, func(ctx context.Context, client, i int) error {
				k := entryKey(0, false).Proto()
				k.InputsHash = fmt.Sprintf("p%d-%s-%d-%d", n, p.name[:3], client, i)
				t := time.Now()
				if err := p.miss(ctx, clients[client], k, fmt.Sprintf("owner-%d", client)); err != nil {
					return err
				}
				m := time.Now()
				if err := p.hit(ctx, clients[client], k, fmt.Sprintf("twin-%d", client)); err != nil {
					return err
				}
				misses[client] = append(misses[client], m.Sub(t))
				hits[client] = append(hits[client], time.Since(m))
				return nil
			})
			return err
		})
		if err != nil {
			return round{}, fmt.Errorf("%s: %w", p.name, err)
		}
		r := round{pairs: res.Ops, rpcs: float64(calls.Load()) / float64(res.Ops), cpu: cpu.Per(res.Ops), perSecond: res.PerSecond()}
		for c := range misses {
			r.miss.Latencies = append(r.miss.Latencies, misses[c]...)
			r.hit.Latencies = append(r.hit.Latencies, hits[c]...)
		}
		return r, nil
	}
	// A round not counted first: connections, statements and caches warm up on it.
	for _, p := range []cachePath{fourCalls, twoCalls} {
		if _, err := run(p, -1); err != nil {
			return PathsResult{}, err
		}
	}
	var fours, twos []round
	var ratios, pgRatios []float64
	for n := range o.Rounds {
		fmt.Fprintf(progress, "paths, round %d\n", n+1)
		f, err := run(fourCalls, n)
		if err != nil {
			return PathsResult{}, err
		}
		t, err := run(twoCalls, n)
		if err != nil {
			return PathsResult{}, err
		}
		fours, twos = append(fours, f), append(twos, t)
		ratios = append(ratios, float64(t.cpu.Total())/float64(f.cpu.Total()))
		if o.Postgres != nil {
			pgRatios = append(pgRatios, float64(t.cpu["Postgres"])/float64(f.cpu["Postgres"]))
		}
	}
	stats := func(name string, rs []round) PathStats {
		s := PathStats{Name: name, CPU: benchutil.CPUUse{}, Miss: rs[len(rs)-1].miss, Hit: rs[len(rs)-1].hit}
		var perSecond, rpcs []float64
		groups := map[string][]float64{}
		for _, r := range rs {
			perSecond, rpcs = append(perSecond, r.perSecond), append(rpcs, r.rpcs)
			for g, d := range r.cpu {
				groups[g] = append(groups[g], float64(d))
			}
		}
		s.PairsPerSecond, s.RPCsPerPair = benchutil.Median(perSecond), benchutil.Median(rpcs)
		for g, ds := range groups {
			s.CPU[g] = time.Duration(benchutil.Median(ds))
		}
		return s
	}
	return PathsResult{
		Four: stats(fourCalls.name, fours), Two: stats(twoCalls.name, twos),
		CPURatio: benchutil.Median(ratios), PostgresRatio: benchutil.Median(pgRatios), HavePostgres: o.Postgres != nil,
	}, nil
}

// WritePaths writes the paths part's report.
func WritePaths(w io.Writer, o Options, r PathsResult) {
	fmt.Fprintf(w, "### One cacheable action, a miss and an identical action's hit: %d clients, %s per round, medians of %d rounds in turn\n\n",
		o.Clients, o.Duration, o.Rounds)
	groups := make([]string, 0, len(r.Four.CPU))
	for g := range r.Four.CPU {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	header := "| path | RPCs per action | actions/s | miss p50 | miss p99 | hit p50 | hit p99 |"
	for _, g := range groups {
		header += " CPU: " + g + " |"
	}
	fmt.Fprintln(w, header+" CPU in all |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"+strings.Repeat(" ---: |", len(groups)+1))
	for _, s := range []PathStats{r.Four, r.Two} {
		row := fmt.Sprintf("| %s | %.2f | %.0f | %s | %s | %s | %s |", s.Name, s.RPCsPerPair, s.PairsPerSecond,
			round(s.Miss.Percentile(0.5)), round(s.Miss.Percentile(0.99)), round(s.Hit.Percentile(0.5)), round(s.Hit.Percentile(0.99)))
		for _, g := range groups {
			row += fmt.Sprintf(" %s |", s.CPU[g].Round(time.Microsecond))
		}
		fmt.Fprintln(w, row+fmt.Sprintf(" %s |", s.CPU.Total().Round(time.Microsecond)))
	}
	fmt.Fprintf(w, "\nCPU per action, two-call path over four-call path (median of the rounds' ratios): **%.0f%%** in all", 100*r.CPURatio)
	if r.HavePostgres {
		fmt.Fprintf(w, ", **%.0f%%** for Postgres", 100*r.PostgresRatio)
	}
	fmt.Fprintln(w, ".")
	fmt.Fprintln(w)
}
