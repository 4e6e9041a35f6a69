// Package cachebench measures the cache service against a baseline taken in the same run:
// Get over real HTTP/2 beside the same primary-key SELECT issued directly with pgx (the
// store's own query, no RPC), GetOrExtendReservation under contention, and what one
// cacheable action costs on the four-call path against the two-call one (paths.go).
package cachebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/cacheservice/store"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/services/auth"
)

// Options size the run.
type Options struct {
	DatabaseURL string
	// Entries is how many cache entries are stored.
	Entries int
	// Clients is the number of concurrent Get clients.
	Clients int
	// Duration is the length of each measurement.
	Duration time.Duration
	// Rounds repeats each Get measurement, alternating baseline and service.
	Rounds int
	// ReservationClients and ReservationKeys shape the contention measurement.
	ReservationClients, ReservationKeys int
	// CompareAuth also measures Get hits with auth mode kubernetes beside auth mode none.
	CompareAuth bool
	// Only runs one part: "get" (Get, reservations under contention, the auth
	// comparison) or "paths" (one cacheable action's calls, four against two).
	Only string
	// Postgres chooses the database's processes for CPU accounting; nil when the bench
	// did not start it.
	Postgres func(benchutil.Proc) bool
}

// Parts are the parts Only may name.
var Parts = []string{"get", "paths"}

func (o Options) runs(part string) bool { return o.Only == "" || o.Only == part }

func entryKey(i int, hit bool) store.Key {
	prefix := "h"
	if !hit {
		prefix = "miss"
	}
	return store.Key{Project: "bench", Domain: "development", TaskName: "bench.task", CacheVersion: "1",
		Signature: "sig", InputsHash: fmt.Sprintf("%s%07d", prefix, i)}
}

func load(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if _, err := pool.Exec(ctx, "TRUNCATE cached_outputs, reservations"); err != nil {
		return err
	}
	now := time.Now()
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"cached_outputs"},
		[]string{"project", "domain", "task_name", "cache_version", "signature", "inputs_hash", "output_uri",
			"source_project", "source_domain", "source_run", "source_action", "source_attempt", "created_at", "updated_at"},
		pgx.CopyFromSlice(n, func(i int) ([]any, error) {
			k := entryKey(i, true)
			return []any{k.Project, k.Domain, k.TaskName, k.CacheVersion, k.Signature, k.InputsHash,
				fmt.Sprintf("s3://bench/run-%d/outputs", i), "bench", "development", fmt.Sprintf("run-%d", i), "a0", int32(1), now, now}, nil
		}))
	if err == nil {
		_, err = pool.Exec(ctx, "VACUUM ANALYZE cached_outputs")
	}
	return err
}

// GetResult compares the two ways of reading one kind of key, and sets them beside the
// cost of the RPC hop alone.
type GetResult struct {
	Kind             string // "hit" or "miss"
	Ceiling, Service benchutil.Result
	CeilingPerSecond float64 // median over rounds
	ServicePerSecond float64
	// HopPerSecond is the median rate of an RPC that does nothing (the same server's
	// grpc.health.v1 Check, which has no interceptors and no database) from the same
	// clients: what the RPC hop alone costs on this machine.
	HopPerSecond float64
	// Ratio is the median over rounds of Get's rate over the same round's ceiling.
	Ratio float64
}

// SerialBound is the rate Get would reach if it cost exactly one empty RPC plus one
// direct query, the two costs adding up on the same CPUs: 1/(1/hop + 1/ceiling).
func (g GetResult) SerialBound() float64 {
	return 1 / (1/g.HopPerSecond + 1/g.CeilingPerSecond)
}

// Run performs every measurement and writes a Markdown report to w.
func Run(ctx context.Context, o Options, w, progress io.Writer) error {
	pool, err := benchutil.OpenMigrated(ctx, o.DatabaseURL, store.Migrations())
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Fprintf(progress, "loading %d entries\n", o.Entries)
	if err := load(ctx, pool, o.Entries); err != nil {
		return err
	}

	url, stopService, err := benchutil.StartService(ctx, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: o.DatabaseURL, Auth: auth.Config{Mode: auth.ModeNone}})
	if err != nil {
		return err
	}
	defer func() { _ = stopService() }()
	httpClients := benchutil.Clients(max(o.Clients, o.ReservationClients), "")
	clients := make([]cachev1connect.CacheServiceClient, len(httpClients))
	hops := make([]*connect.Client[healthv1.HealthCheckRequest, healthv1.HealthCheckResponse], len(clients))
	for i, h := range httpClients {
		clients[i] = cachev1connect.NewCacheServiceClient(h, url)
		hops[i] = connect.NewClient[healthv1.HealthCheckRequest, healthv1.HealthCheckResponse](h, url+"/grpc.health.v1.Health/Check")
	}

	var tableBytes int64
	if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size('cached_outputs')").Scan(&tableBytes); err != nil {
		return err
	}
	fmt.Fprintf(w, "Stored: %d entries, %d bytes with their indexes, %d bytes an entry.\n\n", o.Entries, tableBytes, tableBytes/int64(o.Entries))
	if o.runs("paths") {
		r, err := measurePaths(ctx, o, httpClients, url, progress)
		if err != nil {
			return fmt.Errorf("paths: %w", err)
		}
		WritePaths(w, o, r)
	}
	if !o.runs("get") {
		return nil
	}
	st := store.New(pool)
	var gets []GetResult
	for _, hit := range []bool{true, false} {
		r := GetResult{Kind: map[bool]string{true: "hit", false: "miss"}[hit]}
		var ceil, svc, hop, ratios []float64
		for round := range o.Rounds {
			fmt.Fprintf(progress, "Get %s, round %d\n", r.Kind, round+1)
			c, err := benchutil.RunFor(ctx, o.Clients, o.Duration, func(ctx context.Context, _, _ int) error {
				_, err := st.Get(ctx, entryKey(rand.IntN(o.Entries), hit), 0)
				if !hit && errors.Is(err, store.ErrNotFound) {
					return nil
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("ceiling: %w", err)
			}
			s, err := benchutil.RunFor(ctx, o.Clients, o.Duration, func(ctx context.Context, client, _ int) error {
				_, err := clients[client].Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: entryKey(rand.IntN(o.Entries), hit).Proto()}))
				if !hit && connect.CodeOf(err) == connect.CodeNotFound {
					return nil
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("service: %w", err)
			}
			h, err := benchutil.RunFor(ctx, o.Clients, o.Duration, func(ctx context.Context, client, _ int) error {
				_, err := hops[client].CallUnary(ctx, connect.NewRequest(&healthv1.HealthCheckRequest{}))
				return err
			})
			if err != nil {
				return fmt.Errorf("empty RPC: %w", err)
			}
			ceil, svc, hop = append(ceil, c.PerSecond()), append(svc, s.PerSecond()), append(hop, h.PerSecond())
			ratios = append(ratios, s.PerSecond()/c.PerSecond())
			r.Ceiling, r.Service = c, s // latencies of the last round
		}
		r.CeilingPerSecond, r.ServicePerSecond = benchutil.Median(ceil), benchutil.Median(svc)
		r.HopPerSecond, r.Ratio = benchutil.Median(hop), benchutil.Median(ratios)
		gets = append(gets, r)
	}

	fmt.Fprintf(progress, "GetOrExtendReservation, %d clients on %d keys\n", o.ReservationClients, o.ReservationKeys)
	var acquired, refused atomic.Int64
	res, err := benchutil.RunFor(ctx, o.ReservationClients, o.Duration, func(ctx context.Context, client, _ int) error {
		k := entryKey(rand.IntN(o.ReservationKeys), false).Proto()
		owner := fmt.Sprintf("client-%d", client)
		resp, err := clients[client].GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
			Key: k, OwnerId: owner, HeartbeatInterval: durationpb.New(5 * time.Second),
		}))
		if err != nil {
			return err
		}
		if !resp.Msg.GetAcquired() {
			refused.Add(1)
			return nil
		}
		acquired.Add(1)
		_, err = clients[client].ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: k, OwnerId: owner}))
		return err
	})
	if err != nil {
		return fmt.Errorf("reservations: %w", err)
	}

	fmt.Fprintf(w, "### Get: %d entries, %d concurrent clients, %s per measurement, median of %d rounds\n\n", o.Entries, o.Clients, o.Duration, o.Rounds)
	fmt.Fprintln(w, "| keys | ceiling: pgx SELECT (ops/s) | p50 | p99 | Get over HTTP/2 (ops/s) | p50 | p99 | Get / ceiling |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, g := range gets {
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %.0f | %s | %s | %.0f%% |\n", g.Kind,
			g.CeilingPerSecond, round(g.Ceiling.Percentile(0.5)), round(g.Ceiling.Percentile(0.99)),
			g.ServicePerSecond, round(g.Service.Percentile(0.5)), round(g.Service.Percentile(0.99)),
			100*g.Ratio)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "What the RPC hop alone allows: an empty RPC on the same server from the same clients, and the")
	fmt.Fprintln(w, "rate of one empty RPC plus one direct query when their costs add up on the same CPUs.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| keys | empty RPC (ops/s) | bound: empty RPC + query (ops/s) | bound / ceiling | Get / bound |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for _, g := range gets {
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f%% | %.0f%% |\n", g.Kind, g.HopPerSecond, g.SerialBound(),
			100*g.SerialBound()/g.CeilingPerSecond, 100*g.ServicePerSecond/g.SerialBound())
	}
	fmt.Fprintf(w, "\n### GetOrExtendReservation under contention: %d clients, %d keys, %s\n\n", o.ReservationClients, o.ReservationKeys, o.Duration)
	fmt.Fprintln(w, "Each call that acquires is followed by a ReleaseReservation (not timed).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| calls/s | p50 | p99 | acquired | refused |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: |")
	fmt.Fprintf(w, "| %.0f | %s | %s | %d | %d |\n", float64(res.Ops)/res.Elapsed.Seconds(),
		round(res.Percentile(0.5)), round(res.Percentile(0.99)), acquired.Load(), refused.Load())
	if o.CompareAuth {
		_ = stopService()
		r, err := CompareAuth(ctx, o, progress)
		if err != nil {
			return fmt.Errorf("auth comparison: %w", err)
		}
		WriteAuth(w, o, r)
	}
	return nil
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
