package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/tenancy"
	"github.com/flytekube/backend/internal/textbound"
)

// checkTenancy refuses an action that names a project or domain its namespace is not
// of, before anything is read, written or reported for it: the executor may write
// events and cache entries of every project, so whatever project it believed, the
// services would too.
//
// The refusal is the namespace's doing, not the project's. It goes in the action's
// status (Failed, ProjectNotOfNamespace, and a Warning event) and writes no history, so
// nothing reaches the events service under the project the action names: a Failed
// event there would land on the other project's own action of that run and name. An
// action with history passed this check when it started.
func (s *scope) checkTenancy(ctx context.Context) (ctrl.Result, error) {
	if len(s.ta.Status.PhaseHistory) > 0 {
		return ctrl.Result{}, nil
	}
	var ns metav1.PartialObjectMetadata
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := s.r.Client.Get(ctx, client.ObjectKey{Name: s.ta.Namespace}, &ns); err != nil {
		// The action exists, so its namespace does: not yet in the cache, or the API
		// server is away. Either passes.
		return ctrl.Result{}, fmt.Errorf("reading the namespace %s of the action: %w", s.ta.Namespace, err)
	}
	err := s.r.Options.tenancy().Check(tenancy.Namespace{Name: ns.Name, Labels: ns.Labels}, s.ta.Spec.Project, s.ta.Spec.Domain)
	var refused *tenancy.RefusedError
	if !errors.As(err, &refused) {
		return ctrl.Result{}, err
	}
	s.refuse(flytev1.ReasonProjectNotOfNamespace, refused.Error())
	return ctrl.Result{}, nil
}

// refuse ends an action that was never the executor's to run: its status says why, and
// no history is written (see checkTenancy).
func (s *scope) refuse(reason, message string) {
	st := &s.ta.Status
	st.Phase = flytev1.PhaseFailed
	st.Error = &flytev1.ExecutionError{Code: reason, Kind: flytev1.ErrorKindUser, Message: textbound.Fit(message, flytev1.MaxErrorMessageLength)}
	setConditions(s.ta, flytev1.PhaseFailed, reason, message, s.now)
	if s.r.Recorder != nil {
		s.r.Recorder.Event(s.ta, corev1.EventTypeWarning, reason, message)
	}
	s.log.Info("refused", "reason", reason, "message", message)
	s.r.Metrics.PhaseChanged(string(flytev1.PhaseFailed))
}
