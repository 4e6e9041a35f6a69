// Package kubetest gives tests a real control plane: kube-apiserver and etcd started by
// controller-runtime's envtest, one per test package, with one namespace per test. The
// binaries come from KUBEBUILDER_ASSETS or, when it is unset, from hack/envtest.sh, which
// builds them once per version into a per-user cache.
package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/repo"
)

// Options shape the control plane.
type Options struct {
	// TaskActions serves the project's TaskActions: the CRDs of deploy/crd are loaded
	// too, and a nil Scheme means client-go's built-in types and flyte.org/v1.
	TaskActions bool
	// CRDDirectoryPaths are loaded before tests start.
	CRDDirectoryPaths []string
	// Scheme knows every type the tests use; client-go's built-in types when nil.
	Scheme *runtime.Scheme
}

// withTaskActions is o with what TaskActions asks for.
func (o Options) withTaskActions() (Options, error) {
	crds, err := repo.Path("deploy", "crd")
	if err != nil {
		return o, err
	}
	o.CRDDirectoryPaths = append(slices.Clone(o.CRDDirectoryPaths), crds)
	if o.Scheme == nil {
		o.Scheme = runtime.NewScheme()
		if err := errors.Join(clientgoscheme.AddToScheme(o.Scheme), flytev1.AddToScheme(o.Scheme)); err != nil {
			return o, fmt.Errorf("kubetest: scheme: %w", err)
		}
	}
	return o, nil
}

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a direct (uncached) client.
	Client client.Client
	// Scheme is the scheme Client uses.
	Scheme *runtime.Scheme

	env *envtest.Environment
}

// Start starts kube-apiserver and etcd.
func Start(opts Options) (*Env, error) {
	if opts.TaskActions {
		var err error
		if opts, err = opts.withTaskActions(); err != nil {
			return nil, err
		}
	}
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	scheme := opts.Scheme
	if scheme == nil {
		scheme = clientgoscheme.Scheme
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     opts.CRDDirectoryPaths,
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("kubetest: starting envtest: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("kubetest: creating client: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, env: env}, nil
}

// EtcdURL is etcd's client URL, which also serves its metrics and its JSON gateway
// (benchmarks read the store's size there).
func (e *Env) EtcdURL() string { return e.env.ControlPlane.Etcd.URL.String() }

// Stop stops the control plane.
func (e *Env) Stop() error { return e.env.Stop() }

// Main runs a test package's tests against a control plane started for them; call it
// from TestMain and exit with its result. Each setup runs once the control plane is up
// (for example to start a manager) and returns how to stop what it started.
func Main(m *testing.M, env **Env, opts Options, setups ...func(*Env) (stop func(), err error)) int {
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*env = e
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	for _, setup := range setups {
		stop, err := setup(e)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubetest: setup:", err)
			_ = e.Stop()
			return 1
		}
		stops = append(stops, stop)
	}
	code := m.Run()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	stops = nil
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "kubetest: stopping envtest:", err)
	}
	return code
}

// Assets returns the directory holding kube-apiserver and etcd.
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	dir, err := repo.Build("envtest.sh")
	if err != nil {
		return "", fmt.Errorf("kubetest: %w", err)
	}
	return dir, nil
}

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// Project is the project of the namespaces Namespace makes: the project the tests'
// actions name, which the executor allows only in a namespace of that project.
const Project = "demo"

// ProjectLabel is the namespace label that names its project (the executor's default
// tenancy.projectLabel).
const ProjectLabel = "flyte.org/project"

// Namespace creates a namespace of project Project for one test, named after it, and
// deletes it when the test ends.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	return Namespace(t, e.Client)
}

// Namespace creates a namespace of project Project for one test with c, named after it,
// and deletes it when the test ends.
func Namespace(t testing.TB, c client.Client) string {
	t.Helper()
	return ProjectNamespace(t, c, Project)
}

// ProjectNamespace creates a namespace of project for one test with c, named after the
// test, and deletes it when the test ends.
func ProjectNamespace(t testing.TB, c client.Client, project string) string {
	t.Helper()
	var suffix [3]byte
	_, _ = rand.Read(suffix[:])
	base := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 50 {
		base = strings.TrimRight(base[:50], "-")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: base + "-" + hex.EncodeToString(suffix[:]),
		Labels: map[string]string{ProjectLabel: project}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Create(ctx, ns); err != nil {
		t.Fatalf("kubetest: creating namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Delete(ctx, ns); client.IgnoreNotFound(err) != nil {
			t.Errorf("kubetest: deleting namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// Kubeconfig returns a kubeconfig of an administrator of the control plane, for tools
// (kubectl, other processes) that reach it from outside this process.
func (e *Env) Kubeconfig() ([]byte, error) {
	user, err := e.env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("kubetest: adding an administrator: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("kubetest: writing a kubeconfig: %w", err)
	}
	return kubeconfig, nil
}

// User is a client of the API server authenticated as name, in groups: what it may do is
// what RBAC grants it, so tests can play a tenant with only some rights.
func (e *Env) User(name string, groups ...string) (client.Client, error) {
	user, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("kubetest: adding user %s: %w", name, err)
	}
	c, err := client.New(user.Config(), client.Options{Scheme: e.Scheme})
	if err != nil {
		return nil, fmt.Errorf("kubetest: a client of user %s: %w", name, err)
	}
	return c, nil
}

// RunManager builds a manager with setup, given the context it will run under, and runs
// it until the test ends; stop ends it sooner and waits for it, and is safe to call
// twice. A manager that stops with an error fails the test.
func RunManager(t testing.TB, setup func(context.Context) (manager.Manager, error)) (mgr manager.Manager, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := setup(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return mgr, stop
}
