package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// expectations remember, per action, the newest history entry this process wrote, until
// the informer cache shows it (the "expectations" of Kubernetes' own controllers). The
// cache can lag behind our own writes; a reconcile that sees an older history would redo
// a step and fail on a conflict, so it waits for the cache instead.
//
// An entry lives only until the informer delivers the write it waits for, or the
// action's deletion: a finished action, which no pass looks at again, leaves nothing
// behind.
type expectations struct {
	mu   sync.Mutex
	want map[types.UID]historyMark
}

func newExpectations() *expectations {
	return &expectations{want: make(map[types.UID]historyMark)}
}

// expect records that ta's history, as just written, ends at its last entry.
func (e *expectations) expect(ta *flytev1.TaskAction) {
	m, ok := lastEntry(&ta.Status)
	if !ok {
		return
	}
	e.mu.Lock()
	e.want[ta.UID] = m
	e.mu.Unlock()
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
	if got, _ := lastEntry(&ta.Status); got.before(want) {
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

// has reports whether a write of the action is still expected.
func (e *expectations) has(uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.want[uid]
	return ok
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
