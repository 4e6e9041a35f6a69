package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// expectationLifetime bounds how long a write may be awaited. The informer shows our
// writes within seconds even on a loaded API server; one it never shows (someone else
// took the finalizer off meanwhile) must not hold the action back for ever. A pass run
// after a lapse on a cache that is still behind fails on a conflict and is retried:
// correct, only one write dearer.
const expectationLifetime = time.Minute

// expectations remember, per action, what this process last wrote — the newest history
// entry and whether the finalizer is on — until the informer cache shows it (the
// "expectations" of Kubernetes' own controllers). The cache can lag behind our own
// writes; a reconcile that sees an older copy would redo a step and fail on a conflict,
// so it waits for the cache instead.
//
// An entry lives only until the informer delivers the writes it waits for, the action's
// deletion, or expectationLifetime: a finished action, which no pass looks at again,
// leaves nothing behind.
type expectations struct {
	mu   sync.Mutex
	want map[types.UID]expected
	now  func() time.Time
}

// expected is what the cache must show of one action.
type expected struct {
	history      flytev1.HistoryMark
	hasHistory   bool
	hasFinalizer bool
	finalizer    bool // held, if hasFinalizer
	until        time.Time
}

// shownBy reports whether ta, as the cache holds it, has caught up with e.
func (e expected) shownBy(ta *flytev1.TaskAction) bool {
	if got, _ := ta.Status.PhaseHistory.Last(); e.hasHistory && got.Mark().Before(e.history) {
		return false
	}
	return !e.hasFinalizer || controllerutil.ContainsFinalizer(ta, Finalizer) == e.finalizer
}

func newExpectations() *expectations {
	return &expectations{want: make(map[types.UID]expected), now: time.Now}
}

// expect records that ta's history, as just written, ends at its last entry.
func (e *expectations) expect(ta *flytev1.TaskAction) {
	last, ok := ta.Status.PhaseHistory.Last()
	if !ok {
		return
	}
	e.update(ta.UID, func(x *expected) { x.history, x.hasHistory = last.Mark(), true })
}

// expectFinalizer records that ta's finalizer, as just patched, is on or off.
func (e *expectations) expectFinalizer(ta *flytev1.TaskAction) {
	held := controllerutil.ContainsFinalizer(ta, Finalizer)
	e.update(ta.UID, func(x *expected) { x.finalizer, x.hasFinalizer = held, true })
}

func (e *expectations) update(uid types.UID, change func(*expected)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.want[uid]
	change(&x)
	x.until = e.now().Add(expectationLifetime)
	e.want[uid] = x
}

// stale reports whether ta, as the cache holds it, is older than what this process
// wrote; once it is not, the expectation goes.
func (e *expectations) stale(ta *flytev1.TaskAction) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	want, ok := e.want[ta.UID]
	if !ok {
		return false
	}
	if !want.shownBy(ta) && e.now().Before(want.until) {
		return true
	}
	delete(e.want, ta.UID)
	return false
}

// forget drops what is expected of an action that is gone.
func (e *expectations) forget(uid types.UID) {
	e.mu.Lock()
	delete(e.want, uid)
	e.mu.Unlock()
}

// informerHandler keeps the expectations in step with the informer: a write it shows
// satisfies them, a deletion ends them, and gone calls whatever else holds state for a
// deleted action.
func (e *expectations) informerHandler(gone func(types.UID)) toolscache.ResourceEventHandler {
	observe := func(obj any) {
		if ta, ok := obj.(*flytev1.TaskAction); ok {
			e.stale(ta)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			ta, ok := obj.(*flytev1.TaskAction)
			if !ok {
				return
			}
			e.forget(ta.UID)
			if gone != nil {
				gone(ta.UID)
			}
		},
	}
}
