package executor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/authbench"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// TestExecutorReachesServicesWithTLSAndToken runs both services as a cluster would:
// TLS with a certificate from a private CA, and each auth mode: token-file, and
// kubernetes with ServiceAccount tokens for audience flyte checked by the API server
// against the shipped ClusterRoles. An executor given that CA (serviceCAFile) and an
// executor's token (serviceTokenFile) caches and reports its actions; one holding a
// viewer's token may read the cache but neither store outputs in it nor record events,
// so it is the token that lets the first through.
func TestExecutorReachesServicesWithTLSAndToken(t *testing.T) {
	for _, mode := range []auth.Mode{auth.ModeTokenFile, auth.ModeKubernetes} {
		t.Run(string(mode), func(t *testing.T) { executorWithCredentials(t, mode) })
	}
}

// credentials returns the services' auth configuration and an executor's and a
// viewer's token in mode.
func credentials(t *testing.T, mode auth.Mode) (cfg auth.Config, kube kubernetes.Interface, executorToken, viewerToken string) {
	t.Helper()
	if mode == auth.ModeTokenFile {
		tokens := servicetest.NewTokens(t)
		return auth.Config{Mode: mode, TokenFile: tokens.File}, nil, tokens.Executor, tokens.Viewer
	}
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := authbench.ApplyRoles(ctx, cs); err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	token := func(sa, role string) string {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + sa},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{auth.DefaultAudience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	return auth.Config{Mode: mode}, cs, token("flyte-executor", "flyte-services-executor"), token("viewer", "flyte-services-viewer")
}

func executorWithCredentials(t *testing.T, mode auth.Mode) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	pki := servicetest.NewPKI(t)
	caFile := pki.CAFile
	tls := pki.ServerConfig()
	tokens, kube, executorToken, viewerToken := credentials(t, mode)

	pg := pgtest.New(t)
	eventsURL := httpsURL(servicetest.Run(t, events.Run, events.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Server: tls, Auth: tokens, KubeClient: kube}))
	cacheURL := httpsURL(servicetest.Run(t, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Server: tls, Auth: tokens, KubeClient: kube}))
	executorWith := func(holder, token string) (namespace string) {
		cfg := testConfig()
		cfg.EventsServiceURL, cfg.CacheServiceURL = eventsURL, cacheURL
		cfg.ServiceCAFile, cfg.ServiceTokenFile = caFile, write(holder+".token", token+"\n")
		cfg.Storage.AllowedPrefixes = []string{"mem://out/"}
		ns := env.Namespace(t)
		var count atomic.Int64
		run(t, cfg, ns, &count)
		return ns
	}
	viewerHTTP, err := rpcclient.New(rpcclient.Options{CAFile: caFile, TokenFile: write("viewer-client.token", viewerToken)})
	if err != nil {
		t.Fatal(err)
	}
	viewer := eventsv1connect.NewEventsServiceClient(viewerHTTP, eventsURL)

	ns := executorWith("executor", executorToken)
	first, second := cachedEcho(ns, "first"), cachedEcho(ns, "second")
	for _, ta := range []*flytev1.TaskAction{first, second} {
		if err := env.Client.Create(context.Background(), ta); err != nil {
			t.Fatal(err)
		}
		got := waitDelivered(t, viewer, ta)
		want := map[string]flytev1.CacheStatus{"first": flytev1.CachePopulated, "second": flytev1.CacheHit}[ta.Name]
		if got.Status.CacheStatus != want {
			t.Fatalf("%s: cache status %s; want %s", ta.Name, got.Status.CacheStatus, want)
		}
	}

	nsViewer := executorWith("viewer", viewerToken)
	refused := cachedEcho(nsViewer, "refused")
	refused.Spec.TaskName = "demo.echo-refused"
	if err := env.Client.Create(context.Background(), refused); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client.ObjectKeyFromObject(refused), flytev1.PhaseSucceeded)
	var got flytev1.TaskAction
	eventually.True(t, 10*time.Second, func() bool {
		return env.Client.Get(context.Background(), client.ObjectKeyFromObject(refused), &got) == nil && got.Status.CacheStatus == flytev1.CachePutFailure
	}, func() string {
		return fmt.Sprintf("with a viewer's token: cache status %s; want PutFailure (a viewer may not write the cache)", got.Status.CacheStatus)
	})
	time.Sleep(time.Second) // the publisher has had its chance
	resp, err := viewer.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{
		Id: &flytecorev1.ActionIdentifier{Project: refused.Spec.Project, Domain: refused.Spec.Domain, Run: refused.Spec.RunName, Action: refused.Spec.ActionName},
	}))
	if err != nil || len(resp.Msg.GetEvents()) != 0 {
		t.Fatalf("events recorded with a viewer's token: %v, %v", resp, err)
	}
}

func cachedEcho(ns, name string) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "run-" + name, ActionName: name,
			TaskName: "demo.echo-" + ns, TaskType: "core-echo", RunOutputBase: "mem://out/" + ns + "/run-" + name,
			Cache: &flytev1.CacheSpec{Enabled: true, Version: "1"}},
	}
}

func httpsURL(inst *servicetest.Instance) string {
	return strings.Replace(inst.URL, "http://", "https://", 1)
}
