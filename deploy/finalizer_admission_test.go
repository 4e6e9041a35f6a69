package deploy_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/test/kubetest"
)

// TestTheFinalizerIsSetAtAdmission: with the component finalizer-at-admission, the API
// server stores every TaskAction with the executor's finalizer on, once, beside those
// its creator set, and the executor need not write it; beside the shipped validating
// policy. The binding is held to the test's namespace (kubetest.FinalizerAtAdmission),
// so that the package's other tests are not touched.
func TestTheFinalizerIsSetAtAdmission(t *testing.T) {
	ctx := t.Context()
	installAdmission(t)
	ns := namespace(t, "finalizer", map[string]string{"flyte.org/project": kubetest.Project})
	remove, err := kubetest.FinalizerAtAdmission(ctx, env.Client, ns, controller.Finalizer)
	t.Cleanup(remove)
	if err != nil {
		t.Fatal(err)
	}

	created := func(name string, finalizers ...string) *unstructured.Unstructured {
		a := action(ns, kubetest.Project, "development")
		a.SetName(name)
		a.SetFinalizers(finalizers)
		if err := env.Client.Create(ctx, a, client.DryRunAll); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		return a
	}
	for _, tc := range []struct {
		name  string
		given []string
		want  []string
	}{
		{"none", nil, []string{controller.Finalizer}},
		{"another", []string{"example.com/keep"}, []string{"example.com/keep", controller.Finalizer}},
		{"already", []string{controller.Finalizer}, []string{controller.Finalizer}},
	} {
		a := created(tc.name, tc.given...)
		if got := a.GetFinalizers(); len(got) != len(tc.want) || got[len(got)-1] != tc.want[len(tc.want)-1] {
			t.Errorf("%s: stored with finalizers %v; want %v", tc.name, got, tc.want)
		}
	}
}
