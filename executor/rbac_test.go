package executor_test

import (
	"bytes"
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/internal/repo"
)

// TestRunsWithOnlyItsRBAC runs the executor as a user holding nothing but the generated
// role (deploy/kustomize/base/rbac/role.yaml), with leader election and garbage
// collection on, through a container action's whole life and its deletion: the role
// must be enough, so that what is deployed works, and the markers it comes from must
// name every verb the code uses.
func TestRunsWithOnlyItsRBAC(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	path, err := repo.Path("deploy", "kustomize", "base", "rbac", "role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	user := "executor-" + ns
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
			continue
		}
		switch meta.Kind {
		case "ClusterRole":
			var role rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(doc, &role); err != nil {
				t.Fatal(err)
			}
			role.Name = user // one per test, so that tests do not share it
			create(t, &role)
			create(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}})
		case "Role":
			var role rbacv1.Role
			if err := yaml.UnmarshalStrict(doc, &role); err != nil {
				t.Fatal(err)
			}
			role.Name, role.Namespace = "executor", ns // the lease lives where the executor runs
			create(t, &role)
			create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "executor", Namespace: ns},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "executor"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}})
		default:
			t.Fatalf("unexpected %s in %s", meta.Kind, path)
		}
	}

	restConfig := rest.CopyConfig(env.Config)
	restConfig.Impersonate = rest.ImpersonationConfig{UserName: user}
	cfg := testConfig()
	cfg.LeaderElect, cfg.LeaderElectionNamespace = true, ns
	cfg.GC.Interval, cfg.GC.MaxTTL = metav1.Duration{Duration: 200e6}, metav1.Duration{Duration: 1e9}
	start(t, cfg, ns, runOptions{restConfig: restConfig})

	// A container action, run to the end, then garbage-collected.
	done := containerAction(ns, "r0", 0)
	create(t, done)
	pod := bindAndRun(t, done, "r0-1")
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	waitSucceeded(t, client.ObjectKeyFromObject(done))
	waitGone(t, done)

	// Another, deleted while it runs: aborted, its pod deleted.
	aborted := containerAction(ns, "r1", 0)
	create(t, aborted)
	pod = bindAndRun(t, aborted, "r1-1")
	if err := env.Client.Delete(ctx, aborted); err != nil {
		t.Fatal(err)
	}
	waitGone(t, aborted)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err == nil && pod.DeletionTimestamp == nil {
		t.Fatal("the aborted action's pod was not deleted")
	}
}

// create creates obj with the test's administrator client.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}
