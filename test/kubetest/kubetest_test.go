package kubetest_test

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/test/kubetest"
)

var env *kubetest.Env

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, &env, kubetest.Options{})) }

func TestNamespaceAndObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := env.Namespace(t)

	var got corev1.Namespace
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, &got); err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}

	// The API server really admits and stores objects in it.
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns},
		Data:       map[string]string{"k": "v"},
	}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	again := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cm.Name, Namespace: ns}}
	if err := env.Client.Create(ctx, again); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: %v; want AlreadyExists", err)
	}
	// And it validates them: an invalid name is rejected.
	bad := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "Not_Valid", Namespace: ns}}
	if err := env.Client.Create(ctx, bad); !apierrors.IsInvalid(err) {
		t.Fatalf("invalid name: %v; want Invalid", err)
	}
}

func TestNamespacesAreSeparate(t *testing.T) {
	a, b := env.Namespace(t), env.Namespace(t)
	if a == b {
		t.Fatalf("two namespaces named %s", a)
	}
}
