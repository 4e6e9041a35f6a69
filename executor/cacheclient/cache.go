// Package cacheclient is the executor's side of task output memoization: it computes an
// action's cache key, looks the key up before running, takes a reservation so that an
// identical action running at the same time waits instead of repeating the work,
// heartbeats the reservation on its own timer, and stores the outputs on success. Its
// background work (heartbeats, releases of gone actions' reservations) runs as a
// manager.Runnable (Cache.Start) and stops with the manager.
//
// The cache is an optimization, never a dependency: every error of the cache service
// counts as a miss (or a failed put), and the action runs as if it were not cacheable.
package cacheclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/storage"
	"github.com/flytekube/backend/executor/tracing"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/internal/rpcclient"
)

// requestTimeout bounds a call of the cache service: the cache must never hold an
// action up for long.
const requestTimeout = 10 * time.Second

// NewClient returns a cache service client for url, with the credentials and trust of
// conn (see rpcclient.Options; a zero Timeout means requestTimeout). The executor passes
// its tracing interceptor in opts.
func NewClient(url string, conn rpcclient.Options, opts ...connect.ClientOption) (cachev1connect.CacheServiceClient, error) {
	if conn.Timeout == 0 {
		conn.Timeout = requestTimeout
	}
	httpClient, err := rpcclient.New(conn)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	return cachev1connect.NewCacheServiceClient(httpClient, url, opts...), nil
}

// Options are what a Cache needs beside the cache service and the data store.
type Options struct {
	// Heartbeat is the interval asked for reservations (the service caps it).
	Heartbeat time.Duration
	// Log is where the cache says what went wrong; nil logs nothing.
	Log *slog.Logger
	// Metrics counts refused hits and releases; nil counts nothing.
	Metrics *metrics.Metrics
	// MaxQueuedReleases bounds the gone actions' reservations waiting to be released
	// (Start); zero is DefaultMaxQueuedReleases.
	MaxQueuedReleases int
	// Exists reports whether an action still exists (by key and UID; ExistsIn reads the
	// informer cache): a reservation's heartbeats stop, and it is released, once its
	// action does not. Nil: heartbeats go on until the action is done with the cache.
	Exists func(ctx context.Context, key types.NamespacedName, uid types.UID) (bool, error)
	// KeyScope keeps entries apart: keys computed under one scope (a cluster's name) are
	// not hits under another. Empty shares them with every executor whose scope is empty.
	KeyScope string
}

// Cache talks to the cache service for the reconciler. It is a manager.Runnable: Start
// runs the heartbeats of the reservations held and the releases of gone actions'
// reservations, and both end when Start's context does.
type Cache struct {
	client cachev1connect.CacheServiceClient
	store  storage.DataStore
	opts   Options
	log    *slog.Logger

	mu      sync.Mutex
	holding map[types.UID]*hold             // reservations held, heartbeated while Start runs
	keys    map[types.UID]*cachev1.CacheKey // computed keys, until the action is done with the cache

	// beats is Start's context, the parent of every heartbeat: nil until Start, and
	// stopped once it has ended, when no heartbeat starts any more. beating counts the
	// heartbeats running, for Start to wait for (both under mu).
	beats   context.Context
	stopped bool
	beating sync.WaitGroup

	// releases queue the owners of gone actions' reservations, releasing their details
	// (under mu), for Start's workers.
	releases  workqueue.TypedRateLimitingInterface[string]
	releasing map[string]release
}

// hold is a reservation held: heartbeated on its own timer, every granted interval,
// once Start runs.
type hold struct {
	cancel context.CancelFunc // ends the heartbeats; nil while none run
	key    *cachev1.CacheKey
	owner  string
	action *flytecorev1.ActionIdentifier
	every  time.Duration
	// The action's, copied: the heartbeats must not read the action, which the
	// reconciler changes.
	uid  types.UID
	name types.NamespacedName
}

// stop ends the hold's heartbeats, if they run.
func (h *hold) stop() {
	if h.cancel != nil {
		h.cancel()
	}
}

// New creates a cache over the cache service c, reading actions' inputs and copying
// hits' outputs through store. Its heartbeats and releases run once it is started
// (Start; the executor adds it to its manager).
func New(c cachev1connect.CacheServiceClient, store storage.DataStore, opts Options) *Cache {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{client: c, store: store, opts: opts, log: log,
		holding: make(map[types.UID]*hold), keys: make(map[types.UID]*cachev1.CacheKey),
		releases: newReleaseQueue(), releasing: make(map[string]release)}
}

// ExistsIn is Options.Exists reading actions from r (the manager's informer cache): an
// action exists while r holds one of its key and UID.
func ExistsIn(r client.Reader) func(context.Context, types.NamespacedName, types.UID) (bool, error) {
	return func(ctx context.Context, key types.NamespacedName, uid types.UID) (bool, error) {
		var ta flytev1.TaskAction
		err := r.Get(ctx, key, &ta)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && ta.UID == uid, err
	}
}

// Enabled reports whether an action is cacheable.
func Enabled(ta *flytev1.TaskAction) bool { return ta.Spec.Cache != nil && ta.Spec.Cache.Enabled }

// Signature hashes the task's definition: what runs and how. A change of image,
// command, arguments, environment or plugin configuration changes the signature, so a
// changed task never serves outputs computed by its old self.
func Signature(spec *flytev1.TaskActionSpec) string {
	def := struct {
		TaskType  string                 `json:"taskType"`
		Container *flytev1.ContainerSpec `json:"container,omitempty"`
		Config    map[string]string      `json:"config,omitempty"` // encoding/json sorts map keys
		EnvVars   map[string]string      `json:"envVars,omitempty"`
	}{spec.TaskType, spec.Container, spec.Config, spec.EnvVars}
	b, _ := json.Marshal(def) // plain data always encodes
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// InputsHash hashes the inputs document minus the inputs the task ignores for caching.
// Objects are hashed in a canonical form (sorted keys), so equal inputs hash alike
// however they were written.
func InputsHash(inputs []byte, ignored []string) (string, error) {
	var doc map[string]json.RawMessage
	if len(inputs) == 0 {
		doc = map[string]json.RawMessage{}
	} else if err := json.Unmarshal(inputs, &doc); err != nil {
		return "", fmt.Errorf("cache: inputs are not a JSON object: %w", err)
	}
	for _, k := range ignored {
		delete(doc, k)
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		var v any
		if err := json.Unmarshal(doc[k], &v); err != nil {
			return "", err
		}
		canon, _ := json.Marshal(v) // re-encoding sorts nested keys too
		fmt.Fprintf(h, "%q=%s;", k, canon)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// key returns an action's cache key, computing it once: it reads and hashes the inputs,
// and an action asks for it on lookup, on every wait, on put and on release.
func (c *Cache) key(ctx context.Context, ta *flytev1.TaskAction) (*cachev1.CacheKey, error) {
	c.mu.Lock()
	k, ok := c.keys[ta.UID]
	c.mu.Unlock()
	if ok {
		return k, nil
	}
	k, err := c.Key(ctx, ta)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.keys[ta.UID] = k
	c.mu.Unlock()
	return k, nil
}

func (c *Cache) forgetKey(ta *flytev1.TaskAction) {
	c.mu.Lock()
	delete(c.keys, ta.UID)
	c.mu.Unlock()
}

// Key computes an action's cache key. The inputs document is read with the data store's
// document limit: hashing it parses it whole (InputsHash), so it is held in memory. One
// over the limit leaves the action without the cache (storage.ErrTooLarge; Lookup says so
// and runs it), as any other failure to compute its key.
func (c *Cache) Key(ctx context.Context, ta *flytev1.TaskAction) (*cachev1.CacheKey, error) {
	var inputs []byte
	if ta.Spec.InputURI != "" {
		var err error
		if inputs, err = storage.DataStoreFor(c.store, ta).Read(ctx, ta.Spec.InputURI); err != nil {
			return nil, fmt.Errorf("cache: reading inputs: %w", err)
		}
	}
	hash, err := InputsHash(inputs, ta.Spec.Cache.IgnoredInputs)
	if err != nil {
		return nil, err
	}
	return &cachev1.CacheKey{
		Project: ta.Spec.Project, Domain: ta.Spec.Domain, TaskName: ta.Spec.TaskName,
		CacheVersion: ta.Spec.Cache.Version, Signature: ScopedSignature(Signature(&ta.Spec), c.opts.KeyScope), InputsHash: hash,
	}, nil
}

// ScopedSignature is a task's signature within scope: the signature itself when scope
// is empty (entries shared, and the keys of releases before scopes), else the hash of
// both, so that the cache service needs no notion of scope and no other field of the
// key changes.
func ScopedSignature(signature, scope string) string {
	if scope == "" {
		return signature
	}
	sum := sha256.Sum256([]byte(signature + "\x00scope:" + scope))
	return hex.EncodeToString(sum[:])
}

// Decision is what Lookup found.
type Decision struct {
	// Hit: the outputs are at OutputsURI (copied to the action's own outputs location).
	Hit        bool
	OutputsURI string
	// Wait: another owner holds the reservation; look again after Wait.
	Wait time.Duration
	// Holder says what is being waited for: the holder's run and action as the service
	// tells them ("r1/a0"), or the reserved task and cache version when it names none.
	Holder string
	// HolderExpires is when the holder's reservation ends unless it heartbeats.
	HolderExpires time.Time
	// Status is the cache status to report when the action runs (Miss, or Skipped when
	// the cache was not read: it could not be consulted, or the action overwrites).
	Status flytev1.CacheStatus
	// Stale: the entry's outputs were gone, so the action runs and replaces it.
	Stale bool
	// Overwrite: spec.cache.overwrite, so the entry was not read.
	Overwrite bool
}

func owner(ta *flytev1.TaskAction) string { return ta.Namespace + "/" + ta.Name + "/" + string(ta.UID) }

// actionOf is the action a reservation is taken for, as waiters are told.
func actionOf(ta *flytev1.TaskAction) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName}
}

// Lookup consults the cache before an action runs. On a hit the cached outputs are
// copied to outputsURI, through the action's own view of the data store: anyone who can
// write the cache chooses where a hit's outputs are read from, so outputs where the
// action may not read (the executor's own files, another project's data) make the hit a
// miss, logged and counted. A serializable action looks up and reserves in one call
// (LookupOrReserve): on a miss it holds the reservation, heartbeating it until Release,
// or learns whom to wait for. With spec.cache.overwrite nothing is read: a serializable
// action only reserves.
func (c *Cache) Lookup(ctx context.Context, ta *flytev1.TaskAction, outputsURI string) Decision {
	key, err := c.key(ctx, ta)
	if err != nil {
		c.log.Warn("cache key unavailable; running without the cache", "action", ta.Name, "error", err)
		return Decision{Status: flytev1.CacheSkipped}
	}
	overwrite := ta.Spec.Cache.Overwrite
	if !ta.Spec.Cache.Serializable {
		if overwrite {
			return Decision{Status: flytev1.CacheSkipped, Overwrite: true}
		}
		got, err := c.client.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: key}))
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			return Decision{Status: flytev1.CacheMiss}
		case err != nil:
			c.log.Warn("cache service unavailable; treating as a miss", "action", ta.Name, "error", err)
			return Decision{Status: flytev1.CacheSkipped}
		}
		d := c.useHit(ctx, ta, got.Msg.GetOutput(), outputsURI)
		if d.Hit {
			c.forgetKey(ta) // done with the cache
		}
		return d
	}
	res, err := c.lookupOrReserve(ctx, ta, key, overwrite)
	if err != nil {
		c.log.Warn("cache service unavailable; running without the cache", "action", ta.Name, "error", err)
		return Decision{Status: flytev1.CacheSkipped}
	}
	var stale bool
	if out := res.GetOutput(); out != nil {
		d := c.useHit(ctx, ta, out, outputsURI)
		if d.Hit {
			c.forgetKey(ta)
			return d
		}
		// The entry is of no use: reserve past it, so that the outputs are computed once.
		stale = d.Stale
		if res, err = c.lookupOrReserve(ctx, ta, key, true); err != nil {
			c.log.Warn("reservation unavailable; running without it", "action", ta.Name, "error", err)
			return Decision{Status: flytev1.CacheMiss, Stale: stale}
		}
	}
	r := res.GetReservation()
	granted := r.GetHeartbeatInterval().AsDuration()
	if !res.GetAcquired() {
		holder := key.GetTaskName() + "@" + key.GetCacheVersion()
		if h := r.GetHolderAction(); h != nil {
			holder = h.GetRun() + "/" + h.GetAction()
		}
		return Decision{Wait: granted, Holder: holder, HolderExpires: r.GetExpiresAt().AsTime(), Status: flytev1.CacheMiss}
	}
	c.keepAlive(ta, key, granted)
	if overwrite {
		return Decision{Status: flytev1.CacheSkipped, Overwrite: true}
	}
	return Decision{Status: flytev1.CacheMiss, Stale: stale}
}

func (c *Cache) lookupOrReserve(ctx context.Context, ta *flytev1.TaskAction, key *cachev1.CacheKey, skipLookup bool) (*cachev1.LookupOrReserveResponse, error) {
	res, err := c.client.LookupOrReserve(ctx, connect.NewRequest(&cachev1.LookupOrReserveRequest{
		Key: key, OwnerId: owner(ta), HeartbeatInterval: durationpb.New(c.opts.Heartbeat), Action: actionOf(ta), SkipLookup: skipLookup,
	}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// useHit copies a hit's outputs as Lookup says. It returns the hit, or Status Miss when
// the outputs cannot be used: gone (Stale, counted and logged), refused or unreadable.
func (c *Cache) useHit(ctx context.Context, ta *flytev1.TaskAction, out *cachev1.CachedOutput, outputsURI string) Decision {
	from := out.GetOutputUri()
	cerr := copyOutputs(ctx, storage.DataStoreFor(c.store, ta), from, outputsURI)
	var refused *storage.NotAllowedError
	switch {
	case cerr == nil && from == "":
		return Decision{Hit: true} // remembered as succeeded, with no outputs
	case cerr == nil:
		return Decision{Hit: true, OutputsURI: outputsURI}
	case errors.Is(cerr, storage.ErrTooLarge):
		c.log.Warn("cached outputs are over the data store's copy limit; treating the hit as a miss", "action", ta.Name, "error", cerr)
	case errors.As(cerr, &refused):
		c.opts.Metrics.CacheOutputsRefused(refused.Reason)
		c.log.Warn("cached outputs lie where the action may not read; treating the hit as a miss",
			"action", ta.Name, "outputs", from, "reason", refused.Reason, "error", cerr)
	case errors.Is(cerr, storage.ErrNotFound):
		src := out.GetSourceAction()
		c.log.Warn("cached outputs are gone; running the action and replacing the entry", "action", ta.Name,
			"outputs", from, "source", src.GetRun()+"/"+src.GetAction())
		return Decision{Status: flytev1.CacheMiss, Stale: true}
	default:
		c.log.Warn("cached outputs unreadable; treating as a miss", "action", ta.Name, "error", cerr)
	}
	return Decision{Status: flytev1.CacheMiss}
}

// keepAlive heartbeats a held reservation on its own timer, independent of how often
// the action is reconciled, for as long as the action exists: an action that goes away
// without a last pass (deleted before its finalizer was on, or its finalizer taken off
// by hand) must not hold identical actions back for ever. The heartbeats run under
// Start's context: held before Start, a reservation is heartbeated from Start on; once
// Start has ended (the executor stops), it is not, and lapses unless the next leader
// resumes it.
func (c *Cache) keepAlive(ta *flytev1.TaskAction, key *cachev1.CacheKey, every time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.holding[ta.UID]; ok {
		return
	}
	h := &hold{key: key, owner: owner(ta), action: actionOf(ta), every: every,
		uid: ta.UID, name: types.NamespacedName{Namespace: ta.Namespace, Name: ta.Name}}
	c.holding[ta.UID] = h
	if c.beats != nil && !c.stopped {
		c.heartbeat(h)
	}
}

// heartbeat starts h's heartbeats under Start's context. The caller holds c.mu, and
// Start runs.
func (c *Cache) heartbeat(h *hold) {
	// Heartbeats stay out of the action's trace, or a long action would pile up thousands
	// of identical spans there: an unsampled parent tells the samplers here and in the
	// cache service to record none.
	unsampled := tracing.SpanContext(h.uid).WithTraceFlags(0)
	ctx, cancel := context.WithCancel(trace.ContextWithRemoteSpanContext(c.beats, unsampled))
	h.cancel = cancel
	c.beating.Add(1)
	go func() {
		defer c.beating.Done()
		defer cancel()
		t := time.NewTicker(h.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if c.opts.Exists != nil {
					if ok, err := c.opts.Exists(ctx, h.name, h.uid); err == nil && !ok {
						c.log.Info("the action holding a reservation is gone; releasing it", "action", h.name.Name)
						c.Gone(h.uid)
						return
					}
				}
				_, err := c.client.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
					Key: h.key, OwnerId: h.owner, HeartbeatInterval: durationpb.New(c.opts.Heartbeat), Action: h.action,
				}))
				if err != nil && ctx.Err() == nil {
					c.log.Warn("reservation heartbeat failed", "action", h.name.Name, "error", err)
				}
			}
		}
	}()
}

// Gone lets go of what the cache holds for an action that no longer exists: its key and,
// if it holds a reservation, the heartbeats and the reservation itself, which is
// released in the background (Start). The informer's delete handler calls it: it never
// waits on the cache service.
func (c *Cache) Gone(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holding[uid]
	delete(c.holding, uid)
	delete(c.keys, uid)
	if h == nil {
		return
	}
	h.stop()
	c.queueRelease(release{key: h.key, owner: h.owner})
}

// Holds reports whether the action's reservation is being heartbeated.
func (c *Cache) Holds(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.holding[uid]
	return ok
}

// copyOutputs copies a hit's outputs, streamed where the store can (storage.Copier): they
// are another task's, of any size, and never held whole; over the store's copy limit
// the copy fails (storage.ErrTooLarge) and the hit is a miss.
func copyOutputs(ctx context.Context, store storage.DataStore, from, to string) error {
	if from == "" {
		return nil // the task has no outputs
	}
	if copier, ok := store.(storage.Copier); ok {
		return copier.Copy(ctx, from, to)
	}
	data, err := store.Read(ctx, from)
	if err != nil {
		return err
	}
	return store.Write(ctx, to, data)
}

// Store puts a succeeded action's outputs in the cache and releases its reservation,
// in one call when it holds one (PutAndRelease); it returns the cache status to report.
func (c *Cache) Store(ctx context.Context, ta *flytev1.TaskAction, outputsURI string) flytev1.CacheStatus {
	key, err := c.key(ctx, ta)
	if err != nil {
		c.Release(ctx, ta)
		return flytev1.CachePutFailure
	}
	// A task without outputs is stored with none: an identical one is a hit all the same.
	put := &cachev1.PutRequest{
		Key: key, OutputUri: outputsURI, SourceAttempt: uint32(max(ta.Status.Attempts, 1)),
		SourceAction: actionOf(ta), OutputBytes: c.outputBytes(ctx, ta, outputsURI),
		// A newer run of the same key replaces an entry whose outputs may be gone.
		Overwrite: true,
	}
	c.mu.Lock()
	h, held := c.holding[ta.UID]
	delete(c.holding, ta.UID)
	c.mu.Unlock()
	if !held {
		defer c.Release(ctx, ta)
		if _, err := c.client.Put(ctx, connect.NewRequest(put)); err != nil {
			c.log.Warn("storing outputs in the cache failed", "action", ta.Name, "error", err)
			return flytev1.CachePutFailure
		}
		return flytev1.CachePopulated
	}
	h.stop()
	c.forgetKey(ta)
	if _, err := c.client.PutAndRelease(ctx, connect.NewRequest(&cachev1.PutAndReleaseRequest{Put: put, OwnerId: h.owner})); err != nil {
		c.log.Warn("storing outputs in the cache failed", "action", ta.Name, "error", err)
		c.releaseHeld(ctx, ta, h)
		return flytev1.CachePutFailure
	}
	return flytev1.CachePopulated
}

// outputBytes is the outputs' size, for the cache's bound per project; 0 when the data
// store cannot tell it.
func (c *Cache) outputBytes(ctx context.Context, ta *flytev1.TaskAction, outputsURI string) uint64 {
	sizer, ok := storage.DataStoreFor(c.store, ta).(storage.Sizer)
	if outputsURI == "" || !ok {
		return 0
	}
	n, err := sizer.Size(ctx, outputsURI)
	if err != nil {
		c.log.Warn("the outputs' size is unknown; caching them as empty for the bound", "action", ta.Name, "error", err)
		return 0
	}
	return uint64(max(n, 0))
}

// releaseHeld gives up a reservation whose heartbeats have stopped.
func (c *Cache) releaseHeld(ctx context.Context, ta *flytev1.TaskAction, h *hold) {
	if _, err := c.client.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: h.key, OwnerId: h.owner})); err != nil {
		// It expires by itself after its heartbeats stop.
		c.log.Warn("releasing the reservation failed", "action", ta.Name, "error", err)
	}
}

// Resume makes sure a running serializable action's reservation is heartbeated, as
// after an executor restart: otherwise it would expire and an identical action could
// take it over and run the same work again.
func (c *Cache) Resume(ctx context.Context, ta *flytev1.TaskAction) {
	c.mu.Lock()
	_, ok := c.holding[ta.UID]
	c.mu.Unlock()
	if ok || !ta.Spec.Cache.Serializable {
		return
	}
	key, err := c.key(ctx, ta)
	if err != nil {
		return
	}
	res, err := c.client.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
		Key: key, OwnerId: owner(ta), HeartbeatInterval: durationpb.New(c.opts.Heartbeat), Action: actionOf(ta),
	}))
	if err != nil || !res.Msg.GetAcquired() {
		return // lost it; the action runs on regardless, as on any cache failure
	}
	c.keepAlive(ta, key, res.Msg.GetReservation().GetHeartbeatInterval().AsDuration())
}

// Release gives up the action's reservation. Only its owner's reservation is deleted,
// so releasing one the action does not hold is harmless.
func (c *Cache) Release(ctx context.Context, ta *flytev1.TaskAction) {
	c.mu.Lock()
	h, ok := c.holding[ta.UID]
	delete(c.holding, ta.UID)
	c.mu.Unlock()
	if ok {
		h.stop()
	}
	if !ta.Spec.Cache.Serializable {
		c.forgetKey(ta)
		return
	}
	key, err := c.key(ctx, ta)
	c.forgetKey(ta)
	if err != nil {
		return
	}
	if _, err := c.client.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: key, OwnerId: owner(ta)})); err != nil {
		// It expires by itself after its heartbeats stop.
		c.log.Warn("releasing the reservation failed", "action", ta.Name, "error", err)
	}
}
