// Package backlog bounds what an events outage piles up. The garbage collector keeps a
// finished action until its history is delivered to the events service, so while the
// service is away every action that finishes stays in etcd and in the executor's memory
// (its informer cache, the event sink's pending snapshots). The Gate counts those
// finished, undelivered actions and, at a bound, holds the actions that have not
// started yet; running actions go on and finish. Held actions wait in a line that is
// fair across namespaces (executor/fairqueue) and go back to the reconciler one for
// each place that delivery frees, with no one touching them.
//
// The count is kept from what the informer shows (an action found finished whose history
// the sink has not acknowledged), what the reconciler writes (a finish, before the
// informer shows it) and what the sink acknowledges. A new leader knows nothing
// delivered: it counts every finished action it finds until the sink has delivered it
// again, and it admits nothing before that count is complete.
package backlog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/fairqueue"
	"github.com/flytekube/backend/executor/metrics"
)

// Options configure a Gate.
type Options struct {
	// Max is how many finished actions whose history is not yet delivered may be stored
	// before new actions wait; at least 1.
	Max int
	// Cache is the manager's informer cache, whose actions the gate counts.
	Cache cache.Cache
	// Metrics records the count and the held actions; nil records nothing.
	Metrics *metrics.Metrics
	Log     *slog.Logger
}

// Deliveries is what the gate reads of the event sink (eventsink.Publisher), which
// knows nothing of the gate.
type Deliveries interface {
	// Delivered reports whether an action's whole history has been delivered (after a
	// restart, no until it is delivered again).
	Delivered(*flytev1.TaskAction) bool
	// NotifyDelivered has f called with each finished action whose whole history is
	// delivered from now on.
	NotifyDelivered(f func(*flytev1.TaskAction))
}

// Gate decides whether an action that has not started may start. Make one with New; the
// reconciler watches its Source, which counts the backlog before the first reconcile and
// wakes held actions.
type Gate struct {
	opts Options
	sink Deliveries
	// line is where held actions wait to be woken, in turn by namespace; made when the
	// Source starts, before anything is held.
	line *fairqueue.Queue[types.NamespacedName]
	// changed tells the waker that room may have been freed.
	changed chan struct{}

	mu sync.Mutex
	// synced: the informer's actions have all been counted.
	synced bool
	// undelivered are the stored finished actions whose history the sink has not
	// acknowledged: what Max bounds.
	undelivered map[types.UID]struct{}
	// held are the actions waiting for room; woken those of them handed back to the
	// reconciler, each holding a place until its pass admits it.
	held, woken map[types.NamespacedName]types.UID
	// admitting counts the passes admitted and not yet ended: an action that finishes in
	// the pass that started it is counted only when that pass writes its finish.
	admitting int
	// holding: new actions wait in line behind those already held, until none is.
	holding bool
}

// New makes a gate that counts down the backlog as sink delivers it.
func New(sink Deliveries, opts Options) *Gate {
	g := &Gate{
		opts:        opts,
		sink:        sink,
		changed:     make(chan struct{}, 1),
		undelivered: map[types.UID]struct{}{},
		held:        map[types.NamespacedName]types.UID{},
		woken:       map[types.NamespacedName]types.UID{},
	}
	sink.NotifyDelivered(g.acknowledged)
	return g
}

// Bound is Options.Max.
func (g *Gate) Bound() int { return g.opts.Max }

// Held reports whether ta's status is that of an action held by a gate: Queued, no
// history, and Progressing for EventsBacklog.
func Held(ta *flytev1.TaskAction) bool {
	if ta.Status.Phase != flytev1.PhaseQueued || len(ta.Status.PhaseHistory) > 0 {
		return false
	}
	c := meta.FindStatusCondition(ta.Status.Conditions, flytev1.ConditionProgressing)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == flytev1.ReasonEventsBacklog
}

// Admit reports whether the action, which has not started, may start now. If it may,
// the caller calls Release once the pass ends (after writing its status). If not, it is
// held: it waits in line and its key is queued again when there is room for it.
func (g *Gate) Admit(key types.NamespacedName, uid types.UID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	defer g.report()
	if w, ok := g.woken[key]; ok && w == uid {
		// Its place was kept since it was woken.
		delete(g.woken, key)
		delete(g.held, key)
		g.admitting++
		return true
	}
	if !g.holding {
		if g.synced && g.room() {
			g.admitting++
			return true
		}
		g.holding = true
		g.opts.Log.Warn("new actions wait: the finished actions whose history the events service has not taken reached the bound; running actions go on",
			"undelivered", len(g.undelivered), "bound", g.opts.Max, "setting", "eventsBacklog.maxUndeliveredFinished")
	}
	g.hold(key, uid)
	return false
}

// Release ends a pass that Admit let start.
func (g *Gate) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.admitting--
	g.freed()
}

// Finished is told of a finished status the reconciler just wrote: it counts from now,
// not from when the informer shows it.
func (g *Gate) Finished(ta *flytev1.TaskAction) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.count(ta)
	g.report()
}

// acknowledged is told (by the event sink) that a finished action's whole history was
// delivered.
func (g *Gate) acknowledged(ta *flytev1.TaskAction) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.undelivered[ta.UID]; ok {
		delete(g.undelivered, ta.UID)
		g.freed()
		g.report()
	}
}

// Source is what the reconciler watches: at its start it counts the informer's actions
// (the controller starts no worker before its sources have started), then wakes held
// actions, until ctx ends.
func (g *Gate) Source() source.TypedSource[reconcile.Request] {
	return source.TypedFunc[reconcile.Request](func(ctx context.Context, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		informer, err := g.opts.Cache.GetInformer(ctx, &flytev1.TaskAction{})
		if err != nil {
			return fmt.Errorf("events backlog: getting the actions' informer: %w", err)
		}
		g.mu.Lock()
		g.line = fairqueue.New(fairqueue.Options[types.NamespacedName]{TenantOf: func(k types.NamespacedName) string { return k.Namespace }})
		g.mu.Unlock()
		reg, err := informer.AddEventHandler(g.handler())
		if err != nil {
			return fmt.Errorf("events backlog: watching actions: %w", err)
		}
		// The handler hears of every action the informer holds before HasSynced: the
		// finished undelivered ones, and those a previous leader held.
		if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return fmt.Errorf("events backlog: counting the cached actions: %w", context.Cause(ctx))
		}
		g.mu.Lock()
		g.synced = true
		g.holding = len(g.held) > 0 || !g.room()
		if g.holding {
			g.opts.Log.Warn("new actions wait: the finished actions whose history the events service has not taken reached the bound, or a previous leader held actions",
				"undelivered", len(g.undelivered), "held", len(g.held), "bound", g.opts.Max, "setting", "eventsBacklog.maxUndeliveredFinished")
		}
		g.report()
		g.mu.Unlock()
		go func() {
			<-ctx.Done()
			g.line.ShutDown()
			_ = informer.RemoveEventHandler(reg)
		}()
		go g.wake(ctx, queue)
		return nil
	})
}

// room says whether one more action may start. The caller holds g.mu.
func (g *Gate) room() bool {
	return len(g.undelivered)+g.admitting+len(g.woken) < g.opts.Max
}

// count adds ta, if finished and not delivered, to the backlog. The caller holds g.mu,
// which orders the question to the sink before its acknowledgement (acknowledged), so
// that an action delivered meanwhile is never left counted.
func (g *Gate) count(ta *flytev1.TaskAction) {
	if ta.Status.Phase.IsTerminal() && !g.sink.Delivered(ta) {
		g.undelivered[ta.UID] = struct{}{}
	}
}

// hold puts an action in line, once. The caller holds g.mu.
func (g *Gate) hold(key types.NamespacedName, uid types.UID) {
	if g.held[key] == uid {
		return
	}
	g.held[key] = uid
	g.line.Add(key)
}

// unhold forgets a held action that started, finished or went; a place kept for it is
// freed. The caller holds g.mu.
func (g *Gate) unhold(key types.NamespacedName, uid types.UID) {
	if g.held[key] == uid {
		delete(g.held, key)
	}
	if g.woken[key] == uid {
		delete(g.woken, key)
	}
}

// freed tells the waker that room may have been made, and stops holding new actions once
// no held one is left. The caller holds g.mu.
func (g *Gate) freed() {
	if g.holding && len(g.held) == 0 && len(g.woken) == 0 {
		g.holding = false
		g.opts.Log.Info("new actions start again: no action waits for the events backlog",
			"undelivered", len(g.undelivered), "bound", g.opts.Max)
	}
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// report sets the gauges. The caller holds g.mu.
func (g *Gate) report() {
	g.opts.Metrics.EventsBacklog(len(g.undelivered), len(g.held), g.opts.Max)
}

// wake hands held actions back to the reconciler, in the line's order, each once there
// is room for it, until ctx ends.
func (g *Gate) wake(ctx context.Context, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	for {
		key, shutdown := g.line.Get()
		if shutdown {
			return
		}
		g.line.Done(key)
		if !g.wakeWhenRoom(ctx, key, queue) {
			return
		}
	}
}

// wakeWhenRoom waits for room, then keeps a place for the held action and queues it; an
// action no longer held is passed over. It returns false once ctx ends.
func (g *Gate) wakeWhenRoom(ctx context.Context, key types.NamespacedName, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) bool {
	g.mu.Lock()
	for {
		uid, held := g.held[key]
		if _, woken := g.woken[key]; !held || woken {
			g.mu.Unlock()
			return true
		}
		if g.room() {
			g.woken[key] = uid
			g.mu.Unlock()
			queue.Add(reconcile.Request{NamespacedName: key})
			return true
		}
		g.mu.Unlock()
		select {
		case <-g.changed:
		case <-ctx.Done():
			return false
		}
		g.mu.Lock()
	}
}

// handler keeps the count in step with the informer.
func (g *Gate) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { g.observe(obj) },
		UpdateFunc: func(_, obj any) { g.observe(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			ta, ok := obj.(*flytev1.TaskAction)
			if !ok {
				return
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			delete(g.undelivered, ta.UID)
			g.unhold(client.ObjectKeyFromObject(ta), ta.UID)
			g.freed()
			g.report()
		},
	}
}

// observe counts an action the informer shows. Until the first count is complete it also
// lines up the actions a previous leader held; after, only Admit holds, so that an old
// copy of an action admitted meanwhile does not hold it again.
func (g *Gate) observe(obj any) {
	ta, ok := obj.(*flytev1.TaskAction)
	if !ok {
		return
	}
	key := client.ObjectKeyFromObject(ta)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case ta.Status.Phase.IsTerminal() || len(ta.Status.PhaseHistory) > 0:
		if _, waiting := g.held[key]; waiting {
			g.unhold(key, ta.UID)
			g.freed()
		}
		g.count(ta)
	case !g.synced && Held(ta) && ta.DeletionTimestamp.IsZero():
		g.hold(key, ta.UID)
	default:
		return
	}
	g.report()
}
