package eventsbench

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flytekube/backend/bench/benchutil"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/authbench"
)

// AuthResult sets Record with auth mode kubernetes (decisions cached) beside Record with
// auth mode none, in alternating rounds of the first batch size.
type AuthResult struct {
	BatchSize                          int
	NonePerSecond, KubernetesPerSecond float64
	Ratio                              float64 // median of the rounds' kubernetes / none
}

// CompareAuth measures Record through none (the service Run started) and through a
// second service in auth mode kubernetes against a real API server.
func CompareAuth(ctx context.Context, o Options, pool *pgxpool.Pool, none *service, progress io.Writer) (AuthResult, error) {
	fmt.Fprintln(progress, "starting an API server for auth mode kubernetes")
	cluster, err := authbench.Start(ctx)
	if err != nil {
		return AuthResult{}, err
	}
	defer func() { _ = cluster.Stop() }()
	kube, err := startServiceWith(ctx, o, auth.Config{Mode: auth.ModeKubernetes}, cluster.Client, cluster.Token)
	if err != nil {
		return AuthResult{}, err
	}
	defer func() { _ = kube.stop() }()

	r := AuthResult{BatchSize: o.BatchSizes[0]}
	record := func(svc *service, prefix string) (float64, error) {
		if err := truncate(ctx, pool); err != nil {
			return 0, err
		}
		evs := generate(prefix, o.IngestEvents, 100)
		d, err := fanOut(o.Clients, batches(evs, r.BatchSize), func(c int, b []*eventsv1.ActionEvent) error {
			_, err := svc.clients[c].Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
			return err
		})
		return float64(len(evs)) / d.Seconds(), err
	}
	var noneRates, kubeRates, ratios []float64
	for round := range o.Rounds {
		fmt.Fprintf(progress, "Record, auth none and kubernetes, round %d\n", round+1)
		n, err := record(none, fmt.Sprintf("an%d", round))
		if err != nil {
			return r, fmt.Errorf("auth none: %w", err)
		}
		k, err := record(kube, fmt.Sprintf("ak%d", round))
		if err != nil {
			return r, fmt.Errorf("auth kubernetes: %w", err)
		}
		noneRates, kubeRates, ratios = append(noneRates, n), append(kubeRates, k), append(ratios, k/n)
	}
	r.NonePerSecond, r.KubernetesPerSecond = benchutil.Median(noneRates), benchutil.Median(kubeRates)
	r.Ratio = benchutil.Median(ratios)
	return r, nil
}

// WriteAuth writes the comparison as a Markdown table.
func WriteAuth(w io.Writer, o Options, r AuthResult) {
	fmt.Fprintf(w, "\n### Record with authentication: batch %d, %d events, %d clients, median of %d alternating rounds\n\n", r.BatchSize, o.IngestEvents, o.Clients, o.Rounds)
	fmt.Fprintln(w, "| auth mode | events/s |")
	fmt.Fprintln(w, "| --- | ---: |")
	fmt.Fprintf(w, "| none | %.0f |\n", r.NonePerSecond)
	fmt.Fprintf(w, "| kubernetes (TokenReview + SubjectAccessReview, cached) | %.0f |\n", r.KubernetesPerSecond)
	fmt.Fprintf(w, "\nkubernetes / none: **%.0f%%** (median of the rounds' own ratios)\n", 100*r.Ratio)
}
