package chaos

import (
	"context"
	"fmt"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// undeletableLabel, on a TaskAction, makes the API server refuse to delete it: the
// soak's ValidatingAdmissionPolicy, as a webhook, a policy or a 403 would in a cluster.
const undeletableLabel = "chaos.flyte.org/undeletable"

// refuseDeletes applies the policy and its binding, and waits until the API server
// enforces it (a probe action, labelled, whose delete is refused; the label is then
// taken off and the probe deleted).
func refuseDeletes(ctx context.Context, c client.Client) error {
	fail := admissionv1.Fail
	deny := []admissionv1.ValidationAction{admissionv1.Deny}
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "chaos-undeletable"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Delete},
					Rule:       admissionv1.Rule{APIGroups: []string{flytev1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"taskactions"}},
				}}}},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf(`!has(oldObject.metadata.labels) || !(%q in oldObject.metadata.labels)`, undeletableLabel),
				Message:    "chaos: this action may not be deleted",
				Reason:     new(metav1.StatusReasonForbidden),
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "chaos-undeletable"},
		Spec:       admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name, ValidationActions: deny},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("undeletable: creating %s: %w", o.GetName(), err)
		}
	}
	probe := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: "undeletable-probe", Namespace: leaderNS, Labels: map[string]string{undeletableLabel: "true"}},
		Spec: flytev1.TaskActionSpec{Project: "probe", Domain: "development", RunName: "probe", ActionName: "probe", TaskType: "core-echo", TaskName: "probe",
			RunOutputBase: "file:///nonexistent"}}
	if err := c.Create(ctx, probe); err != nil {
		return fmt.Errorf("undeletable: creating the probe: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.Delete(ctx, probe.DeepCopy())
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("undeletable: the policy was not enforced within a minute (delete: %v)", err)
		}
		if err == nil {
			// Deleted before the policy was in force: a new probe.
			probe.ResourceVersion, probe.UID = "", ""
			if err := c.Create(ctx, probe); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("undeletable: creating the probe: %w", err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, undeletableLabel))
	if err := c.Patch(ctx, probe, patch); err != nil {
		return fmt.Errorf("undeletable: unlabelling the probe: %w", err)
	}
	if err := c.Delete(ctx, probe); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("undeletable: deleting the probe: %w", err)
	}
	return nil
}
