package controller

import "k8s.io/apimachinery/pkg/types"

// Expects reports whether a write of the action is not yet in the informer cache; the
// tests check that a finished action leaves no expectation behind.
func (r *TaskActionReconciler) Expects(uid types.UID) bool { return r.expectations().has(uid) }

// has reports whether a write of the action is still expected.
func (e *expectations) has(uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.want[uid]
	return ok
}
