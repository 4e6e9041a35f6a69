package cacheclient_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flytekube/backend/cacheservice"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/datastore"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

// env is a real cache service on its own database, the executor's confined data store
// over a temporary directory, and a client of the service for the test's own checks.
type env struct {
	svc   *servicetest.Instance
	dbURL string
	store *datastore.Confined
	dir   string
	probe cachev1connect.CacheServiceClient
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dbURL := pg.NewDatabase(t)
	svc := servicetest.Run(t, cacheservice.Run, cacheservice.Config{
		Listen: "127.0.0.1:0", DatabaseURL: dbURL, Auth: auth.Config{Mode: auth.ModeNone},
	})
	dir := t.TempDir()
	// As the executor's: each project and domain with its own part of the storage.
	store, err := datastore.Confine(datastore.New(), []string{"file://" + dir + "/projects/{project}/{domain}"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	probe, err := cacheclient.NewClient(svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{svc: svc, dbURL: dbURL, store: store, dir: dir, probe: probe}
}

// cache returns the executor's cache over a client of the service that passes its calls
// through interceptors, started (heartbeating what it holds) until the test ends.
func (e *env) cache(t *testing.T, interceptors ...connect.Interceptor) *cacheclient.Cache {
	t.Helper()
	client, err := cacheclient.NewClient(e.svc.URL, rpcclient.Options{}, connect.WithInterceptors(interceptors...))
	if err != nil {
		t.Fatal(err)
	}
	c := cacheclient.New(client, e.store, cacheclient.Options{Heartbeat: time.Second, Log: slog.New(slog.DiscardHandler)})
	start(t, c)
	return c
}

// start runs c's background work until the test ends, as the executor's manager does.
func start(t *testing.T, c *cacheclient.Cache) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("the cache's Start: %v", err)
		}
	})
}

// uri is a file:// URI in the demo project's part of the storage.
func (e *env) uri(name string) string {
	return "file://" + e.dir + "/projects/demo/development/" + name
}

// action is a serializable cacheable action; actions made with the same inputs are
// identical, whatever their names.
func (e *env) action(name, inputsURI string) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: flytev1.TaskActionSpec{
			Project: "demo", Domain: "development", RunName: "r1", ActionName: name, TaskName: "square", TaskType: "test",
			InputURI: inputsURI, RunOutputBase: e.uri("r1"),
			Cache: &flytev1.CacheSpec{Enabled: true, Version: "v1", Serializable: true},
		},
	}
}

func (e *env) write(t *testing.T, uri, content string) {
	t.Helper()
	if err := e.store.Write(context.Background(), uri, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

func (e *env) read(t *testing.T, uri string) string {
	t.Helper()
	b, err := e.store.Read(context.Background(), uri)
	if err != nil {
		t.Fatalf("reading %s: %v", uri, err)
	}
	return string(b)
}

// requireReservationFree fails unless nobody holds the key's reservation: a fresh owner
// acquires it (and gives it back).
func (e *env) requireReservationFree(t *testing.T, c *cacheclient.Cache, ta *flytev1.TaskAction) {
	t.Helper()
	ctx := context.Background()
	key, err := c.Key(ctx, ta)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.probe.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
		Key: key, OwnerId: "probe", HeartbeatInterval: durationpb.New(time.Second),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Msg.GetAcquired() {
		t.Fatal("the reservation is still held")
	}
	if _, err := e.probe.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: key, OwnerId: "probe"})); err != nil {
		t.Fatal(err)
	}
}

// callsTo is an interceptor that records the cache RPCs made for the action whose UID
// is uid, by method name.
func callsTo(uid types.UID) (connect.Interceptor, func() []string) {
	var (
		mu    sync.Mutex
		calls []string
	)
	owned := func(msg any) bool {
		switch r := msg.(type) {
		case interface{ GetOwnerId() string }:
			return strings.HasSuffix(r.GetOwnerId(), "/"+string(uid))
		case interface {
			GetSourceAction() *flytecorev1.ActionIdentifier
		}:
			return true // a Put without a reservation names no owner
		}
		return true
	}
	icpt := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if owned(req.Any()) {
				mu.Lock()
				calls = append(calls, req.Spec().Procedure[strings.LastIndex(req.Spec().Procedure, "/")+1:])
				mu.Unlock()
			}
			return next(ctx, req)
		}
	})
	return icpt, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
}

// A serializable action that misses costs two calls of the cache service, the lookup
// that reserves and the put that releases, and one that hits costs one (five and one
// before LookupOrReserve and PutAndRelease: Get, GetOrExtendReservation, Get again,
// Put, ReleaseReservation). The put carries the outputs' size, for the project's bound.
func TestCallsPerCacheableAction(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"x": 5}`)
	a, b := e.action("a", inputs), e.action("b", inputs)
	outA, outB := e.uri("a/outputs.json"), e.uri("b/outputs.json")
	icptA, callsA := callsTo(a.UID)
	icptB, callsB := callsTo(b.UID)
	ca, cb := e.cache(t, icptA), e.cache(t, icptB)

	if d := ca.Lookup(ctx, a, outA); d.Hit || d.Wait != 0 || d.Status != flytev1.CacheMiss {
		t.Fatalf("A's lookup = %+v, want a miss that holds the reservation", d)
	}
	e.write(t, outA, `{"y": 25}`)
	if got := ca.Store(ctx, a, outA); got != flytev1.CachePopulated {
		t.Fatalf("A's store = %q", got)
	}
	if got, want := callsA(), []string{"LookupOrReserve", "PutAndRelease"}; !slices.Equal(got, want) {
		t.Fatalf("a miss called %v; want %v", got, want)
	}
	if d := cb.Lookup(ctx, b, outB); !d.Hit {
		t.Fatalf("B's lookup = %+v, want a hit", d)
	}
	if got, want := callsB(), []string{"LookupOrReserve"}; !slices.Equal(got, want) {
		t.Fatalf("a hit called %v; want %v", got, want)
	}
	var size int64
	pgtest.QueryRow(t, e.dbURL, "SELECT output_bytes FROM cached_outputs", &size)
	if size != int64(len(`{"y": 25}`)) {
		t.Fatalf("the entry counts %d output bytes; want %d", size, len(`{"y": 25}`))
	}
	e.requireReservationFree(t, ca, b)
}

// A hit whose outputs are gone is a miss that runs, holding the reservation so that an
// identical action waits for it, and its outputs replace the entry.
func TestStaleHitRunsAndReplacesTheEntry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"x": 6}`)
	a, b, c := e.action("a", inputs), e.action("b", inputs), e.action("c", inputs)
	outA, outB, outC := e.uri("a/outputs.json"), e.uri("b/outputs.json"), e.uri("c/outputs.json")
	cc := e.cache(t)
	cc.Lookup(ctx, a, outA)
	e.write(t, outA, `{"y": 36}`)
	cc.Store(ctx, a, outA)
	if err := os.Remove(strings.TrimPrefix(outA, "file://")); err != nil {
		t.Fatal(err)
	}

	if d := cc.Lookup(ctx, b, outB); d.Hit || !d.Stale || d.Wait != 0 || !cc.Holds(b.UID) {
		t.Fatalf("B's lookup = %+v (holds %v), want a stale miss holding the reservation", d, cc.Holds(b.UID))
	}
	if d := cc.Lookup(ctx, c, outC); d.Wait <= 0 || d.Holder != "r1/b" {
		t.Fatalf("C's lookup = %+v, want a wait on r1/b", d)
	}
	e.write(t, outB, `{"y": 36, "again": true}`)
	cc.Store(ctx, b, outB)
	if d := cc.Lookup(ctx, c, outC); !d.Hit {
		t.Fatalf("C's lookup after B stored = %+v, want a hit", d)
	}
	if got := e.read(t, outC); got != `{"y": 36, "again": true}` {
		t.Fatalf("C's outputs = %s, want B's", got)
	}
}

// spec.cache.overwrite runs whatever the cache holds (reserving first, since the action
// is serializable) and replaces the entry; an identical action that does not overwrite
// uses the entry there is, the old one until the overwrite is stored.
func TestOverwriteRunsAndReplacesTheEntry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"x": 7}`)
	a, b, c := e.action("a", inputs), e.action("b", inputs), e.action("c", inputs)
	b.Spec.Cache.Overwrite = true
	outA, outB, outC := e.uri("a/outputs.json"), e.uri("b/outputs.json"), e.uri("c/outputs.json")
	cc := e.cache(t)
	cc.Lookup(ctx, a, outA)
	e.write(t, outA, `{"y": 49}`)
	cc.Store(ctx, a, outA)

	if d := cc.Lookup(ctx, b, outB); d.Hit || !d.Overwrite || d.Status != flytev1.CacheSkipped || !cc.Holds(b.UID) {
		t.Fatalf("B's lookup = %+v (holds %v), want it to run, holding the reservation, the cache not read", d, cc.Holds(b.UID))
	}
	e.write(t, outB, `{"y": 49, "overwritten": true}`)
	if got := cc.Store(ctx, b, outB); got != flytev1.CachePopulated {
		t.Fatalf("B's store = %q", got)
	}
	if d := cc.Lookup(ctx, c, outC); !d.Hit || e.read(t, outC) != `{"y": 49, "overwritten": true}` {
		t.Fatalf("C's lookup after B stored = %+v, want a hit on B's outputs", d)
	}

	// Without serialization nothing is asked before the run.
	d := e.action("d", inputs)
	d.Spec.Cache.Serializable, d.Spec.Cache.Overwrite = false, true
	icpt, calls := callsTo(d.UID)
	if got := e.cache(t, icpt).Lookup(ctx, d, e.uri("d/outputs.json")); got.Hit || !got.Overwrite {
		t.Fatalf("D's lookup = %+v, want it to run", got)
	}
	if len(calls()) != 0 {
		t.Fatalf("an overwriting action that is not serializable called %v before running", calls())
	}
}

// The plain paths: the first of two identical actions misses and holds the reservation,
// the second waits for it, and once the first has stored, the second hits.
func TestLookupMissWaitHit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"x": 4}`)
	a, b := e.action("a", inputs), e.action("b", inputs)
	outA, outB := e.uri("a/outputs.json"), e.uri("b/outputs.json")
	c := e.cache(t)

	if d := c.Lookup(ctx, a, outA); d.Hit || d.Wait != 0 || d.Status != flytev1.CacheMiss {
		t.Fatalf("A's lookup = %+v, want a miss that holds the reservation", d)
	}
	if d := c.Lookup(ctx, b, outB); d.Hit || d.Wait <= 0 || d.Holder != "r1/a" || !d.HolderExpires.After(time.Now()) {
		t.Fatalf("B's lookup = %+v, want a wait on r1/a, whose reservation runs on", d)
	}
	e.write(t, outA, `{"y": 16}`)
	if got := c.Store(ctx, a, outA); got != flytev1.CachePopulated {
		t.Fatalf("A's store = %q, want %q", got, flytev1.CachePopulated)
	}
	if d := c.Lookup(ctx, b, outB); !d.Hit || d.OutputsURI != outB {
		t.Fatalf("B's lookup after A stored = %+v, want a hit", d)
	}
	if got := e.read(t, outB); got != `{"y": 16}` {
		t.Fatalf("B's outputs = %s, want A's", got)
	}
	e.requireReservationFree(t, c, b)
}
