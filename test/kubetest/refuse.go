package kubetest

import (
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/test/eventually"
)

// RefuseDeletes installs an admission policy under which the API server refuses to
// delete any TaskAction labelled label=value, as a webhook or a policy of the cluster's
// would, and returns once it is in force for probe (an action so labelled). The policy
// goes when the test ends.
func RefuseDeletes(t testing.TB, c client.Client, label, value string, probe client.Object) {
	t.Helper()
	ctx := context.Background()
	name := "refuse-deletes-" + value
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{label: value}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"flyte.org"}, APIVersions: []string{"*"},
						Resources: []string{"taskactions"}},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "false",
				Message: "this action is held for an investigation", Reason: ptr.To(metav1.StatusReasonForbidden)}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}
	eventually.True(t, time.Minute, func() bool {
		return apierrors.IsForbidden(c.Delete(ctx, probe.DeepCopyObject().(client.Object), client.DryRunAll))
	}, func() string { return "the API server never refused to delete " + probe.GetName() })
}
