package cacheservice_test

import (
	"context"
	"os"
	"testing"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/cacheservice"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

type instance struct {
	*servicetest.Instance
	client cachev1connect.CacheServiceClient
}

func startInstance(t *testing.T, dbURL string, mutate ...func(*cacheservice.Config)) *instance {
	t.Helper()
	cfg := cacheservice.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", DatabaseURL: dbURL, Auth: auth.Config{Mode: auth.ModeNone}}
	inst := servicetest.Run(t, cacheservice.Run, cfg, mutate...)
	return &instance{Instance: inst, client: cachev1connect.NewCacheServiceClient(inst.HTTP, inst.URL, connect.WithGRPC())}
}

func key(task, version, inputs string) *cachev1.CacheKey {
	return &cachev1.CacheKey{Project: "demo", Domain: "development", TaskName: task, CacheVersion: version, Signature: "sig1", InputsHash: inputs}
}

func source(action string) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: "r1", Action: action}
}

func put(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, uri string, mutate ...func(*cachev1.PutRequest)) (*cachev1.CachedOutput, error) {
	req := &cachev1.PutRequest{Key: k, OutputUri: uri, SourceAction: source("a0"), SourceAttempt: 1}
	for _, m := range mutate {
		m(req)
	}
	resp, err := c.Put(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetOutput(), nil
}

// refusal is a call the service must refuse with InvalidArgument, its message naming
// want.
type refusal struct {
	name string
	call func() error
	want string
}

// requireRefused makes each refusal's call in a subtest of its own; want is a field, as
// protovalidate names it.
func requireRefused(t *testing.T, refusals []refusal) {
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) { servicetest.RequireInvalidArgument(t, r.call(), r.want) })
	}
}

// countRows counts the entries and the reservations stored.
func countRows(t *testing.T, dbURL string) (entries, reservations int) {
	t.Helper()
	pgtest.QueryRow(t, dbURL, "SELECT (SELECT count(*) FROM cached_outputs), (SELECT count(*) FROM reservations)", &entries, &reservations)
	return entries, reservations
}

func requireNothingStored(t *testing.T, dbURL string) {
	t.Helper()
	if n, r := countRows(t, dbURL); n != 0 || r != 0 {
		t.Fatalf("refused calls wrote %d entries and %d reservations", n, r)
	}
}
