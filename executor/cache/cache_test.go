package cache_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flytekube/backend/cacheservice"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cache"
	"github.com/flytekube/backend/executor/plugin/datastore"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/internal/pgtest"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/internal/servicetest"
	"github.com/flytekube/backend/services/auth"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

// env is a real cache service on its own database, the executor's confined data store
// over a temporary directory, and a client of the service for the test's own checks.
type env struct {
	svc   *servicetest.Instance
	store *datastore.Confined
	dir   string
	probe cachev1connect.CacheServiceClient
}

func newEnv(t *testing.T) *env {
	t.Helper()
	svc := servicetest.Run(t, cacheservice.Run, cacheservice.Config{
		Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Auth: auth.Config{Mode: auth.ModeNone},
	})
	dir := t.TempDir()
	// As the executor's: each project and domain with its own part of the storage.
	store, err := datastore.Confine(datastore.New(), []string{"file://" + dir + "/projects/{project}/{domain}"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	probe, err := cache.NewClient(svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{svc: svc, store: store, dir: dir, probe: probe}
}

// cache returns the executor's cache over a client of the service that passes its calls
// through interceptors.
func (e *env) cache(t *testing.T, interceptors ...connect.Interceptor) *cache.Cache {
	t.Helper()
	client, err := cache.NewClient(e.svc.URL, rpcclient.Options{}, connect.WithInterceptors(interceptors...))
	if err != nil {
		t.Fatal(err)
	}
	return cache.New(client, e.store, time.Second, slog.New(slog.DiscardHandler))
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
func (e *env) requireReservationFree(t *testing.T, c *cache.Cache, ta *flytev1.TaskAction) {
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

// beforeReserving is an interceptor that calls hook once, just before the first
// GetOrExtendReservation of the action whose UID is uid goes out.
func beforeReserving(uid types.UID, hook func()) (connect.Interceptor, *atomic.Bool) {
	var fired atomic.Bool
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if r, ok := req.Any().(*cachev1.GetOrExtendReservationRequest); ok &&
				strings.HasSuffix(r.GetOwnerId(), "/"+string(uid)) && fired.CompareAndSwap(false, true) {
				hook()
			}
			return next(ctx, req)
		}
	}), &fired
}

// B looks up while A still runs (a miss), then A stores its outputs and releases its
// reservation, and only then does B ask for the reservation, which is now free: B must
// find A's outputs rather than run the work again.
func TestReservationGrantedAfterAStoreIsAHit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"x": 3}`)
	a, b := e.action("a", inputs), e.action("b", inputs)
	outA, outB := e.uri("a/outputs.json"), e.uri("b/outputs.json")

	var c *cache.Cache
	var stored flytev1.CacheStatus
	icpt, fired := beforeReserving(b.UID, func() { stored = c.Store(ctx, a, outA) })
	c = e.cache(t, icpt)

	if d := c.Lookup(ctx, a, outA); d.Hit || d.Wait != 0 || d.Status != flytev1.CacheMiss {
		t.Fatalf("A's lookup = %+v, want a miss that holds the reservation", d)
	}
	e.write(t, outA, `{"y": 9}`) // A's work

	d := c.Lookup(ctx, b, outB)
	if !fired.Load() || stored != flytev1.CachePopulated {
		t.Fatalf("A did not store between B's lookup and B's reservation (fired %v, stored %q)", fired.Load(), stored)
	}
	if !d.Hit || d.OutputsURI != outB {
		t.Fatalf("B's lookup = %+v, want a hit with outputs at %s: B would run the work again", d, outB)
	}
	if got := e.read(t, outB); got != `{"y": 9}` {
		t.Fatalf("B's outputs = %s, want A's", got)
	}
	e.requireReservationFree(t, c, b)
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
	if d := c.Lookup(ctx, b, outB); d.Hit || d.Wait <= 0 || d.Holder != "square@v1" {
		t.Fatalf("B's lookup = %+v, want a wait for square@v1", d)
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
