package cacheservice_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flytekube/backend/cacheservice"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/servicetest"
)

func lookup(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner string, mutate ...func(*cachev1.LookupOrReserveRequest)) (*cachev1.LookupOrReserveResponse, error) {
	req := &cachev1.LookupOrReserveRequest{Key: k, OwnerId: owner, HeartbeatInterval: durationpb.New(5 * time.Second),
		Action: &flytecorev1.ActionIdentifier{Project: k.GetProject(), Domain: k.GetDomain(), Run: "r1", Action: owner}}
	for _, m := range mutate {
		m(req)
	}
	resp, err := c.LookupOrReserve(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func putAndRelease(ctx context.Context, c cachev1connect.CacheServiceClient, k *cachev1.CacheKey, owner, uri string, mutate ...func(*cachev1.PutRequest)) (*cachev1.PutAndReleaseResponse, error) {
	put := &cachev1.PutRequest{Key: k, OutputUri: uri, SourceAction: source(owner), SourceAttempt: 1}
	for _, m := range mutate {
		m(put)
	}
	resp, err := c.PutAndRelease(ctx, connect.NewRequest(&cachev1.PutAndReleaseRequest{Put: put, OwnerId: owner}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// TestLookupOrReserve: one call answers a hit with the entry and a miss with the
// reservation, taken for the caller or, when another holds it, naming the holder's
// action and its expiry; skip_lookup reserves past an entry.
func TestLookupOrReserve(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	stored := key("demo.train", "1", "stored")
	if _, err := put(ctx, inst.client, stored, "s3://bucket/out/stored"); err != nil {
		t.Fatal(err)
	}
	held := key("demo.train", "1", "held")
	if res, err := lookup(ctx, inst.client, held, "holder"); err != nil || !res.GetAcquired() {
		t.Fatalf("first claimant: %v, %v; want the reservation", res, err)
	}

	tests := []struct {
		name       string
		key        *cachev1.CacheKey
		owner      string
		skip       bool
		wantHit    string // the hit's output URI
		wantGrant  bool
		wantHolder string // the holder's action named to a refused caller
	}{
		{name: "a hit is the entry", key: stored, owner: "a", wantHit: "s3://bucket/out/stored"},
		{name: "skip_lookup reserves past an entry", key: stored, owner: "b", skip: true, wantGrant: true},
		{name: "a miss reserves", key: key("demo.train", "1", "fresh"), owner: "c", wantGrant: true},
		{name: "a held miss names the holder", key: held, owner: "d", wantHolder: "r1/holder"},
		{name: "the holder extends its own", key: held, owner: "holder", wantGrant: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := lookup(ctx, inst.client, tt.key, tt.owner, func(r *cachev1.LookupOrReserveRequest) { r.SkipLookup = tt.skip })
			if err != nil {
				t.Fatal(err)
			}
			if got := res.GetOutput().GetOutputUri(); got != tt.wantHit {
				t.Fatalf("hit %q; want %q", got, tt.wantHit)
			}
			if tt.wantHit != "" {
				return
			}
			r := res.GetReservation()
			if res.GetAcquired() != tt.wantGrant || r == nil || r.GetExpiresAt().AsTime().Before(time.Now()) {
				t.Fatalf("acquired %v, reservation %v; want acquired %v, expiring later", res.GetAcquired(), r, tt.wantGrant)
			}
			holder := r.GetHolderAction()
			if tt.wantHolder != "" && (holder.GetRun()+"/"+holder.GetAction() != tt.wantHolder || holder.GetProject() != "demo" || r.GetOwnerId() != "") {
				t.Fatalf("refused with holder %v, owner %q; want %s in demo, no owner", holder, r.GetOwnerId(), tt.wantHolder)
			}
		})
	}
	_, err := lookup(ctx, inst.client, key("demo.train", "1", "x"), "e", func(r *cachev1.LookupOrReserveRequest) { r.Action.Project = "other" })
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "action must be in the key's project") {
		t.Fatalf("an action of another project: %v; want InvalidArgument", err)
	}
}

// TestPutAndReleaseIsOneStep: the entry is stored and the caller's reservation goes
// together; when the entry may not be replaced, neither happens.
func TestPutAndReleaseIsOneStep(t *testing.T) {
	dbURL := pg.NewDatabase(t)
	inst := startInstance(t, dbURL)
	ctx := context.Background()
	k := key("demo.train", "1", "pr")
	if res, err := lookup(ctx, inst.client, k, "holder"); err != nil || !res.GetAcquired() {
		t.Fatalf("reserving: %v, %v", res, err)
	}
	res, err := putAndRelease(ctx, inst.client, k, "holder", "s3://bucket/out/1")
	if err != nil || !res.GetReleased() || res.GetOutput().GetOutputUri() != "s3://bucket/out/1" {
		t.Fatalf("PutAndRelease: %v, %v; want stored and released", res, err)
	}
	if entries, reservations := countRows(t, dbURL); entries != 1 || reservations != 0 {
		t.Fatalf("%d entries, %d reservations; want 1 and 0", entries, reservations)
	}

	// Another holder's put of the same key without overwrite is refused, and keeps its
	// reservation.
	if res, err := lookup(ctx, inst.client, k, "second", func(r *cachev1.LookupOrReserveRequest) { r.SkipLookup = true }); err != nil || !res.GetAcquired() {
		t.Fatalf("reserving again: %v, %v", res, err)
	}
	_, err = putAndRelease(ctx, inst.client, k, "second", "s3://bucket/out/2")
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("PutAndRelease over an entry: %v; want AlreadyExists", err)
	}
	if entries, reservations := countRows(t, dbURL); entries != 1 || reservations != 1 {
		t.Fatalf("after the refusal: %d entries, %d reservations; want 1 and 1", entries, reservations)
	}
	res, err = putAndRelease(ctx, inst.client, k, "second", "s3://bucket/out/2", func(p *cachev1.PutRequest) { p.Overwrite = true })
	if err != nil || !res.GetReleased() || res.GetOutput().GetOutputUri() != "s3://bucket/out/2" {
		t.Fatalf("overwriting: %v, %v", res, err)
	}
	// A put whose caller holds nothing stores and releases nothing.
	res, err = putAndRelease(ctx, inst.client, key("demo.train", "1", "unheld"), "nobody", "s3://bucket/out/3")
	if err != nil || res.GetReleased() {
		t.Fatalf("unheld: %v, %v; want stored, nothing released", res, err)
	}
}

// TestIdenticalCallersComputeOnce: callers of one key that each look up, compute when
// granted and store-and-release, waiting otherwise, compute it once between them. A
// holder that stores and releases between another's lookup and its reservation would
// make that one compute again, unless the service looks again once it grants.
func TestIdenticalCallersComputeOnce(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	ctx := context.Background()
	const callers, keys = 8, 40
	for n := range keys {
		k := key("demo.race", "1", fmt.Sprintf("k%d", n))
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			computed int
		)
		for c := range callers {
			wg.Go(func() {
				owner := fmt.Sprintf("c%d", c)
				for {
					res, err := lookup(ctx, inst.client, k, owner)
					switch {
					case err != nil:
						t.Error(err)
						return
					case res.GetOutput() != nil:
						return
					case res.GetAcquired():
						mu.Lock()
						computed++
						mu.Unlock()
						if _, err := putAndRelease(ctx, inst.client, k, owner, "s3://bucket/out/"+owner); err != nil {
							t.Error(err)
						}
						return
					}
				}
			})
		}
		wg.Wait()
		if computed != 1 {
			t.Fatalf("key %d computed %d times; want once", n, computed)
		}
	}
}

// TestCombinedCallsNeedWhatBothNeed: LookupOrReserve reads an entry and writes a
// reservation, PutAndRelease writes both, so a viewer, who may read entries, may call
// neither.
func TestCombinedCallsNeedWhatBothNeed(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.csv")
	lines := fmt.Sprintf("viewer-token,viewer,uid-1,%q\nexecutor-token,executor,uid-2,%q\n", auth.Viewers, auth.Executors)
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	dbURL := pg.NewDatabase(t)
	inst := startInstance(t, dbURL, func(c *cacheservice.Config) {
		c.Auth = auth.Config{Mode: auth.ModeTokenFile, TokenFile: file}
	})
	client := func(token string) cachev1connect.CacheServiceClient {
		return cachev1connect.NewCacheServiceClient(servicetest.WithToken(token), inst.URL, connect.WithGRPC())
	}
	viewer, executor := client("viewer-token"), client("executor-token")
	ctx := context.Background()
	k := key("demo.train", "1", "authz")
	if _, err := viewer.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: k})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("viewer Get: %v; want NotFound (allowed)", err)
	}
	if _, err := lookup(ctx, viewer, k, "v"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("viewer LookupOrReserve: %v; want PermissionDenied", err)
	}
	if _, err := putAndRelease(ctx, viewer, k, "v", "s3://bucket/out/v"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("viewer PutAndRelease: %v; want PermissionDenied", err)
	}
	requireNothingStored(t, dbURL)
	if res, err := lookup(ctx, executor, k, "e"); err != nil || !res.GetAcquired() {
		t.Fatalf("executor LookupOrReserve: %v, %v", res, err)
	}
	if res, err := putAndRelease(ctx, executor, k, "e", "s3://bucket/out/e"); err != nil || !res.GetReleased() {
		t.Fatalf("executor PutAndRelease: %v, %v", res, err)
	}
}
