// Package authbench gives benchmarks and tests what auth mode kubernetes needs: a real
// API server (envtest's, built by hack/envtest.sh), the shipped ClusterRoles, and a
// ServiceAccount token for an identity bound to the executor's role, so that a service's
// hot path can be measured with TokenReview and SubjectAccessReview in the loop.
package authbench

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
)

// Cluster is a running API server and a token allowed every RPC.
type Cluster struct {
	// Client is what the service asks (an administrator's client).
	Client kubernetes.Interface
	// Token is a ServiceAccount token bound to audience auth.DefaultAudience, whose
	// account holds the flyte-services-executor ClusterRole.
	Token string

	env *kubetest.Env
}

// Start starts the API server and prepares the identity.
func Start(ctx context.Context) (*Cluster, error) {
	// envtest logs through controller-runtime's logger; a bench prints tables, not logs.
	ctrllog.SetLogger(logr.Discard())
	env, err := kubetest.Start(kubetest.Options{})
	if err != nil {
		return nil, err
	}
	c := &Cluster{env: env}
	if err := c.prepare(ctx); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return c, nil
}

// Stop stops the API server.
func (c *Cluster) Stop() error { return c.env.Stop() }

func (c *Cluster) prepare(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.env.Config)
	if err != nil {
		return fmt.Errorf("authbench: client: %w", err)
	}
	c.Client = cs
	if _, err := ApplyRoles(ctx, cs); err != nil {
		return err
	}
	const ns, sa = "flyte", "flyte-executor"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("authbench: namespace: %w", err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("authbench: service account: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-executor"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "flyte-services-executor"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("authbench: binding: %w", err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{auth.DefaultAudience}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("authbench: token: %w", err)
	}
	c.Token = tr.Status.Token
	return nil
}

// ApplyRoles creates the ClusterRoles of deploy/kustomize/base/access/roles.yaml (those
// that exist already are left as they are) and returns their names: what a cluster
// admin installs is what benchmarks and tests check against.
func ApplyRoles(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	path, err := repo.Path("deploy", "kustomize", "base", "access", "roles.yaml")
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("authbench: %w", err)
	}
	var names []string
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
			return nil, fmt.Errorf("authbench: %s: %w", path, err)
		}
		if role.Kind != "ClusterRole" {
			continue
		}
		names = append(names, role.Name)
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("authbench: ClusterRole %s: %w", role.Name, err)
		}
	}
	return names, nil
}
