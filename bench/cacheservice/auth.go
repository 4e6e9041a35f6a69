package cachebench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/cacheservice"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/authbench"
)

// startFor runs one cache service with authCfg and returns one client per bench client,
// each on its own connection, sending token when not empty.
func startFor(ctx context.Context, o Options, authCfg auth.Config, cluster *authbench.Cluster, token string) ([]cachev1connect.CacheServiceClient, func() error, error) {
	cfg := cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: o.DatabaseURL, Auth: authCfg}
	if cluster != nil {
		cfg.KubeClient = cluster.Client
	}
	url, stop, err := benchutil.StartService(ctx, cacheservice.Run, cfg)
	if err != nil {
		return nil, nil, err
	}
	var clients []cachev1connect.CacheServiceClient
	for _, h := range benchutil.Clients(o.Clients, token) {
		clients = append(clients, cachev1connect.NewCacheServiceClient(h, url))
	}
	return clients, stop, nil
}

// AuthResult sets cache Get hits with auth mode kubernetes (decisions cached) beside the
// same Gets with auth mode none, measured in alternating rounds.
type AuthResult struct {
	NonePerSecond, KubernetesPerSecond float64
	None, Kubernetes                   benchutil.Result // latencies of the last round
	Ratio                              float64          // median of the rounds' kubernetes / none
}

// CompareAuth measures Get hits through a service with auth mode none and one with auth
// mode kubernetes against a real API server, on the entries Run loaded.
func CompareAuth(ctx context.Context, o Options, progress io.Writer) (AuthResult, error) {
	fmt.Fprintln(progress, "starting an API server for auth mode kubernetes")
	cluster, err := authbench.Start(ctx)
	if err != nil {
		return AuthResult{}, err
	}
	defer func() { _ = cluster.Stop() }()
	none, stopNone, err := startFor(ctx, o, auth.Config{Mode: auth.ModeNone}, nil, "")
	if err != nil {
		return AuthResult{}, err
	}
	defer func() { _ = stopNone() }()
	kube, stopKube, err := startFor(ctx, o, auth.Config{Mode: auth.ModeKubernetes}, cluster, cluster.Token)
	if err != nil {
		return AuthResult{}, err
	}
	defer func() { _ = stopKube() }()

	get := func(clients []cachev1connect.CacheServiceClient) (benchutil.Result, error) {
		return benchutil.RunFor(ctx, o.Clients, o.Duration, func(ctx context.Context, client, _ int) error {
			_, err := clients[client].Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: entryKey(rand.IntN(o.Entries), true).Proto()}))
			return err
		})
	}
	var r AuthResult
	var noneRates, kubeRates, ratios []float64
	for round := range o.Rounds {
		fmt.Fprintf(progress, "Get hit, auth none and kubernetes, round %d\n", round+1)
		n, err := get(none)
		if err != nil {
			return r, fmt.Errorf("auth none: %w", err)
		}
		k, err := get(kube)
		if err != nil {
			return r, fmt.Errorf("auth kubernetes: %w", err)
		}
		noneRates, kubeRates = append(noneRates, n.PerSecond()), append(kubeRates, k.PerSecond())
		ratios = append(ratios, k.PerSecond()/n.PerSecond())
		r.None, r.Kubernetes = n, k
	}
	r.NonePerSecond, r.KubernetesPerSecond, r.Ratio = benchutil.Median(noneRates), benchutil.Median(kubeRates), benchutil.Median(ratios)
	return r, nil
}

// WriteAuth writes the comparison as a Markdown table.
func WriteAuth(w io.Writer, o Options, r AuthResult) {
	fmt.Fprintf(w, "\n### Get hits with authentication: %d clients, %s per measurement, median of %d alternating rounds\n\n", o.Clients, o.Duration, o.Rounds)
	fmt.Fprintln(w, "| auth mode | ops/s | p50 | p99 |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
	fmt.Fprintf(w, "| none | %.0f | %s | %s |\n", r.NonePerSecond, round(r.None.Percentile(0.5)), round(r.None.Percentile(0.99)))
	fmt.Fprintf(w, "| kubernetes (TokenReview + SubjectAccessReview, cached) | %.0f | %s | %s |\n", r.KubernetesPerSecond, round(r.Kubernetes.Percentile(0.5)), round(r.Kubernetes.Percentile(0.99)))
	fmt.Fprintf(w, "\nkubernetes / none: **%.0f%%** (median of the rounds' own ratios)\n", 100*r.Ratio)
}
