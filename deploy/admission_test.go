package deploy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/tenancy"
	"github.com/flytekube/backend/test/eventually"
)

// installAdmission applies the TaskAction CRD and the shipped admission policy (the API
// server compiles every expression as it stores it), and returns once the policy
// refuses actions. Its type-checking status is written by the controller manager, which
// this control plane lacks.
func installAdmission(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	applyServed(t, append(render(t, "deploy/crd"), render(t, "deploy/kustomize/base/admission")...))
	// The policy is in force once an action of another project is refused.
	ns := namespace(t, "admission-probe", nil)
	eventually.True(t, time.Minute, func() bool {
		err := createAction(ctx, env.Client, action(ns, "someone-else", "development"))
		return err != nil && strings.Contains(err.Error(), "may not run actions of project")
	}, func() string { return "the admission policy never refused an action of another project" })
}

// namespace makes a namespace for the test with labels, named prefix and a random
// suffix: a deleted namespace stays (this control plane has no namespace controller).
func namespace(t *testing.T, prefix string, labels map[string]string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%06x", prefix, rand.Uint32()&0xffffff)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := env.Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	return name
}

// action is a minimal TaskAction of project and domain in namespace ns.
func action(ns, project, domain string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flyte.org/v1", "kind": "TaskAction",
		"metadata": map[string]any{"name": "a", "namespace": ns},
		"spec": map[string]any{
			"project": project, "domain": domain, "runName": "r", "actionName": "a",
			"taskName": "t", "taskType": "core-sleep", "runOutputBase": "s3://bucket/r",
		},
	}}
	return u
}

// createAction creates u as c would, without storing it: admission runs in full.
func createAction(ctx context.Context, c client.Client, u *unstructured.Unstructured) error {
	return c.Create(ctx, u.DeepCopy(), client.DryRunAll)
}

// TestAdmissionPolicyTiesProjectsToNamespaces holds the shipped policy to the table the
// executor's own check is held to (tenancy.Cases), so that the two cannot disagree.
func TestAdmissionPolicyTiesProjectsToNamespaces(t *testing.T) {
	installAdmission(t)
	for _, c := range tenancy.Cases {
		t.Run(c.Name, func(t *testing.T) {
			// Namespace names are cluster-wide: each case gets its own, of its shape.
			ns := namespace(t, c.Namespace.Name, c.Namespace.Labels)
			project := c.Project
			if project == c.Namespace.Name {
				project = ns // named after the project
			}
			if same := (tenancy.Namespace{Name: ns, Labels: c.Namespace.Labels}); (tenancy.Default().Check(same, project, c.Domain) == nil) != c.Allowed {
				t.Fatalf("the case does not keep its answer in namespace %s", ns)
			}
			err := createAction(t.Context(), env.Client, action(ns, project, c.Domain))
			if allowed := err == nil; allowed != c.Allowed {
				t.Fatalf("namespace %s (labels %v), project %q, domain %q: admitted=%v (%v); the executor's rule says %v",
					ns, c.Namespace.Labels, project, c.Domain, allowed, err, c.Allowed)
			}
			if err != nil && !strings.Contains(err.Error(), `namespace "`+ns+`" may not run actions of`) {
				t.Fatalf("the refusal %q does not say which namespace may not do what", err)
			}
		})
	}
}

// TestAdmissionPolicyGivesNoMoreThanTheCreatorMayHave plays a tenant allowed to create
// TaskActions in its namespace: the policy admits an action only if the tenant could
// also create its pod, act as the ServiceAccount it names and read the Secrets it names.
func TestAdmissionPolicyGivesNoMoreThanTheCreatorMayHave(t *testing.T) {
	installAdmission(t)
	ctx := t.Context()
	ns := namespace(t, "tenant-a", nil)
	tenant, err := env.User("alice", "team-a")
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"flyte.org"}, Resources: []string{"taskactions"}, Verbs: []string{"create"}},
	}}
	if err := env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}}
	if err := env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	grant := func(rule rbacv1.PolicyRule) {
		t.Helper()
		role.Rules = append(role.Rules, rule)
		if err := env.Client.Update(ctx, role); err != nil {
			t.Fatal(err)
		}
	}
	withServiceAccount := func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "builder", "spec", "serviceAccountName")
	}
	withSecrets := func(names ...string) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			var secrets []any
			for i, name := range names {
				secrets = append(secrets, map[string]any{"name": name, "mountPath": fmt.Sprintf("/etc/secret-%d", i)})
			}
			_ = unstructured.SetNestedSlice(u.Object, secrets, "spec", "secrets")
		}
	}
	withSecret := withSecrets("db")
	withSecretInEnv := func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "container", "spec", "taskType")
		_ = unstructured.SetNestedMap(u.Object, map[string]any{"image": "busybox", "env": []any{map[string]any{
			"name": "TOKEN", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "deploy-token", "key": "token"}}}}},
			"spec", "container")
	}
	for _, step := range []struct {
		name   string
		grant  *rbacv1.PolicyRule // before the step
		shape  func(*unstructured.Unstructured)
		refuse string // what the refusal says; empty: admitted
	}{
		{name: "only TaskActions", refuse: `"alice" may not create pods in namespace "tenant-a-`},
		{name: "and pods", grant: &rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}}},
		{name: "as a ServiceAccount", shape: withServiceAccount, refuse: `may not impersonate the ServiceAccount "builder"`},
		{name: "as a ServiceAccount it may act as", shape: withServiceAccount,
			grant: &rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, ResourceNames: []string{"builder"}, Verbs: []string{"impersonate"}}},
		{name: "with a Secret", shape: withSecret, refuse: `"alice" may not get the Secret "db" of namespace "tenant-a-`},
		{name: "with a Secret it may read", shape: withSecret,
			grant: &rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"db", "cache"}, Verbs: []string{"get"}}},
		// Each question to the authorizer costs a third of what the API server allows an
		// expression: three would end the check with an error, not an answer.
		{name: "with a Secret it may read, named three times", shape: withSecrets("db", "db", "db")},
		{name: "with two Secrets it may read", shape: withSecrets("db", "cache", "db", "cache")},
		{name: "with a second Secret it may not read", shape: withSecrets("db", "ssh-key"), refuse: `may not get the Secret "ssh-key"`},
		{name: "with a Secret in the container's env", shape: withSecretInEnv, refuse: `may not get the Secret "deploy-token"`},
		{name: "with three Secrets it may read one by one", shape: withSecrets("db", "cache", "db", "other"),
			refuse: `may not get every Secret of namespace "tenant-a-`},
		{name: "with any Secrets of a namespace whose Secrets it may all read", shape: withSecrets("db", "cache", "other", "more"),
			grant: &rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}},
	} {
		t.Run(step.name, func(t *testing.T) {
			if step.grant != nil {
				grant(*step.grant)
			}
			u := action(ns, ns, "development")
			if step.shape != nil {
				step.shape(u)
			}
			if step.refuse == "" {
				// RBAC's authorizer sees a new rule moments after it is written.
				var err error
				eventually.True(t, 30*time.Second, func() bool { err = createAction(ctx, tenant, u); return err == nil },
					func() string { return fmt.Sprintf("never admitted: %v", err) })
				return
			}
			err := createAction(ctx, tenant, u)
			if err == nil || !strings.Contains(err.Error(), step.refuse) {
				t.Fatalf("admitted or refused otherwise (%v); want a refusal saying %q", err, step.refuse)
			}
		})
	}
}
