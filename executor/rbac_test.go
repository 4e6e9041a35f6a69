package executor_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/repo"
)

// TestRunsWithOnlyItsRBAC runs the executor as a user holding nothing but the generated
// roles, bound as deploy/kustomize binds them for a list of namespaces: role.yaml's
// ClusterRole cluster-wide and its Role in the executor's own namespace, and
// tasks/role.yaml's ClusterRole by a RoleBinding in the one task namespace it manages.
// With leader election and garbage collection on, it runs a container action's whole
// life and its deletion, and a plugin reads the executor's own Secret: the roles must
// be enough, so that what is deployed works, and the markers they come from must name
// every verb the code uses. Then, as the same user, the real authorizer must refuse it
// a task namespace's Secrets and pods outside its namespaces.
func TestRunsWithOnlyItsRBAC(t *testing.T) {
	ctx := context.Background()
	home, tasks, other := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	user := "executor-" + tasks
	bindRoles(t, user, home, tasks, "role.yaml")
	bindRoles(t, user, home, tasks, "tasks/role.yaml")
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "own", Namespace: home}, Data: map[string][]byte{"token": []byte("executor-token")}})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "own", Namespace: tasks}, Data: map[string][]byte{"token": []byte("a task's token")}})

	restConfig := rest.CopyConfig(env.Config)
	restConfig.Impersonate = rest.ImpersonationConfig{UserName: user}
	cfg := testConfig()
	cfg.LeaderElect, cfg.LeaderElectionNamespace = true, home
	cfg.Namespaces, cfg.ExecutorNamespace = []string{tasks}, home
	cfg.GC.Interval, cfg.GC.MaxTTL = metav1.Duration{Duration: 200e6}, metav1.Duration{Duration: 1e9}
	start(t, cfg, tasks, runOptions{restConfig: restConfig, plugins: []core.Entry{secretReaderEntry()}})

	// A plugin's SecretManager reads the executor's own namespace, not the action's.
	reader := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: "reads-own", Namespace: tasks},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r2", ActionName: "reads-own",
			TaskName: "demo.secret", TaskType: "test-secret-reader", RunOutputBase: "mem://out/r2"}}
	create(t, reader)
	waitSucceeded(t, client.ObjectKeyFromObject(reader))

	// A container action, run to the end, then garbage-collected.
	done := containerAction(tasks, "r0", 0)
	create(t, done)
	pod := bindAndRun(t, done, "r0-1")
	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	waitSucceeded(t, client.ObjectKeyFromObject(done))
	waitGone(t, done)

	// Another, deleted while it runs: aborted, its pod deleted.
	aborted := containerAction(tasks, "r1", 0)
	create(t, aborted)
	pod = bindAndRun(t, aborted, "r1-1")
	if err := env.Client.Delete(ctx, aborted); err != nil {
		t.Fatal(err)
	}
	waitGone(t, aborted)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err == nil && pod.DeletionTimestamp == nil {
		t.Fatal("the aborted action's pod was not deleted")
	}

	// What the executor's identity may not do, as the API server decides it.
	as, err := client.New(restConfig, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []struct {
		what string
		do   func() error
	}{
		{"get a Secret in its task namespace", func() error {
			return as.Get(ctx, client.ObjectKey{Namespace: tasks, Name: "own"}, &corev1.Secret{})
		}},
		{"list Secrets in its task namespace", func() error { return as.List(ctx, &corev1.SecretList{}, client.InNamespace(tasks)) }},
		{"list Secrets cluster-wide", func() error { return as.List(ctx, &corev1.SecretList{}) }},
		{"create a pod outside its namespaces", func() error {
			return as.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: other},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}})
		}},
		{"list TaskActions outside its namespaces", func() error {
			return as.List(ctx, &flytev1.TaskActionList{}, client.InNamespace(other))
		}},
	}
	for _, f := range forbidden {
		if err := f.do(); !apierrors.IsForbidden(err) {
			t.Errorf("the executor may %s: %v, want Forbidden", f.what, err)
		}
	}
}

// bindRoles creates the roles of the generated file (under deploy/kustomize/base/rbac)
// for user, as the production overlay binds them: a ClusterRole of role.yaml
// cluster-wide, of tasks/role.yaml in the task namespace only; a Role in the executor's
// own namespace. Names are the test's own, so that tests do not share them.
func bindRoles(t *testing.T, user, home, tasks, file string) {
	t.Helper()
	path, err := repo.Path("deploy", "kustomize", "base", "rbac", file)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	name := user + "-" + strings.TrimSuffix(strings.ReplaceAll(file, "/", "-"), ".yaml")
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	found := 0
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
			continue
		}
		found++
		switch {
		case meta.Kind == "ClusterRole":
			var role rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(doc, &role); err != nil {
				t.Fatal(err)
			}
			role.Name = name
			create(t, &role)
			ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}
			if file == "tasks/role.yaml" {
				create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tasks}, RoleRef: ref, Subjects: subjects})
			} else {
				create(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, RoleRef: ref, Subjects: subjects})
			}
		case meta.Kind == "Role" && file == "role.yaml":
			var role rbacv1.Role
			if err := yaml.UnmarshalStrict(doc, &role); err != nil {
				t.Fatal(err)
			}
			role.Name, role.Namespace = name, home // the lease and its own Secrets live where it runs
			create(t, &role)
			create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: home},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects})
		default:
			t.Fatalf("unexpected %s in %s", meta.Kind, path)
		}
	}
	if found == 0 {
		t.Fatalf("no role in %s", path)
	}
}

// secretReader is a core plugin that reads the Secret "own" (key token) through its
// SecretManager and succeeds if it holds the executor's token, not a task's.
type secretReader struct{}

func (secretReader) GetID() string                  { return "test-secret-reader" }
func (secretReader) GetProperties() core.Properties { return core.Properties{} }
func (secretReader) Handle(ctx context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	v, err := tCtx.SecretManager().Get(ctx, "own", "token")
	if err != nil {
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "SecretUnreadable", err.Error())), nil
	}
	if string(v) != "executor-token" {
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "WrongSecret",
			fmt.Sprintf("read %d bytes that are not the executor's token", len(v)))), nil
	}
	return core.DoTransition(core.PhaseInfoSuccess("")), nil
}
func (secretReader) Abort(context.Context, core.TaskExecutionContext) error    { return nil }
func (secretReader) Finalize(context.Context, core.TaskExecutionContext) error { return nil }

func secretReaderEntry() core.Entry {
	return core.Entry{ID: "test-secret-reader", RegisteredTaskTypes: []string{"test-secret-reader"},
		LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return secretReader{}, nil }}
}

// create creates obj with the test's administrator client.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}
