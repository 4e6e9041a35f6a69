// Package multicluster_test runs the services with two real API servers: each cluster's
// executor authenticates with its own ServiceAccount token, and may record only its own
// cluster's actions.
package multicluster_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/timestamppb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/events"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/authbench"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// east is the services' own cluster, one API server for the package; each test starts
// its other clusters (west), with a token issuer and signing key of their own, as two
// real clusters have, so that it may stop them.
var east *cluster

// kubeconfigs holds the clusters' kubeconfig files.
var kubeconfigs string

type cluster struct {
	name   string
	env    *kubetest.Env
	client kubernetes.Interface
	issuer string
	// kubeconfig is an administrator's, as a platform team gives the services for a
	// cluster they do not run in.
	kubeconfig string
}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if kubeconfigs, err = os.MkdirTemp("", "multicluster-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(kubeconfigs)
	if east, err = startCluster("east"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = east.env.Stop() }()
	return m.Run()
}

// startWest starts a second cluster for t, stopped at its end (or before, by t).
func startWest(t *testing.T) *cluster {
	t.Helper()
	west, err := startCluster(fmt.Sprintf("west-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	west.name = "west"
	t.Cleanup(func() { _ = west.env.Stop() })
	return west
}

func startCluster(name string) (*cluster, error) {
	env, err := kubetest.Start(kubetest.Options{TaskActions: true})
	if err != nil {
		return nil, err
	}
	c := &cluster{name: name, env: env}
	if c.client, err = kubernetes.NewForConfig(env.Config); err != nil {
		return nil, err
	}
	ctx := context.Background()
	if _, err := authbench.ApplyRoles(ctx, c.client); err != nil {
		return nil, err
	}
	// The issuer as the cluster publishes it: what an operator copies into the file.
	raw, err := c.client.CoreV1().RESTClient().Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: issuer discovery: %w", name, err)
	}
	var discovery struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(raw, &discovery); err != nil || discovery.Issuer == "" {
		return nil, fmt.Errorf("%s: issuer discovery gave %s: %v", name, raw, err)
	}
	c.issuer = discovery.Issuer
	kc, err := env.Kubeconfig()
	if err != nil {
		return nil, err
	}
	c.kubeconfig = filepath.Join(kubeconfigs, name+".kubeconfig")
	return c, os.WriteFile(c.kubeconfig, kc, 0o600)
}

// token is a token of a ServiceAccount of c's namespace ns bound to clusterRole.
func (c *cluster) token(t *testing.T, ns, sa, clusterRole, audience string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := c.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// startEvents runs the events service with east as its own cluster and, when remote is
// given, the clusters of a clusters file.
func startEvents(t *testing.T, pg *pgtest.Server, remote ...*cluster) (*servicetest.PKI, string) {
	t.Helper()
	// Answers are not reused, so that a cluster gone is a cluster no longer asked.
	cfg := auth.Config{Mode: auth.ModeKubernetes, Cluster: east.name, Issuer: east.issuer,
		TokenCacheTTL: time.Nanosecond, AllowCacheTTL: time.Nanosecond, DenyCacheTTL: time.Nanosecond}
	if len(remote) > 0 {
		var f auth.ClustersFile
		for _, c := range remote {
			f.Clusters = append(f.Clusters, auth.Cluster{Name: c.name, Issuer: c.issuer, Kubeconfig: c.kubeconfig})
		}
		raw, err := yaml.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ClustersFile = filepath.Join(t.TempDir(), "clusters.yaml")
		if err := os.WriteFile(cfg.ClustersFile, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pki := servicetest.NewPKI(t)
	ev := servicetest.Run(t, events.Run, events.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t),
		Server: pki.ServerConfig(), Auth: cfg, KubeClient: east.client})
	return pki, strings.Replace(ev.URL, "http://", "https://", 1)
}

// record has the holder of token record one event of an action of project that names
// cluster, and returns the call's code (0 when it succeeded).
func record(t *testing.T, pki *servicetest.PKI, url, token, project, action, cluster string) connect.Code {
	t.Helper()
	client := eventsv1connect.NewEventsServiceClient(pki.Client(token), url)
	_, err := client.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{{
		Id:      &flytecorev1.ActionIdentifier{Project: project, Domain: "development", Run: "r1", Action: action},
		Attempt: 1, Phase: flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, OccurredAt: timestamppb.Now(), Cluster: cluster,
	}}}))
	if err == nil {
		return 0
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("record: %v", err)
	}
	return ce.Code()
}

// forged is a token with iss claim issuer that no one signed.
func forged(issuer string) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"iss": issuer, "sub": "system:serviceaccount:flyte:executor", "aud": []string{"flyte"}})
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(claims) + "." + enc([]byte("not-a-signature"))
}

// TestEachClusterRecordsOnlyItsOwnActions: both clusters' executors authenticate with
// their own cluster's tokens, reviewed by that cluster; each may record only actions that
// name its cluster; tokens of a cluster the service does not know, forged ones and ones
// for another audience are refused.
func TestEachClusterRecordsOnlyItsOwnActions(t *testing.T) {
	pg := pgtest.New(t)
	west := startWest(t)
	pki, url := startEvents(t, pg, west)
	ns := east.env.Namespace(t) // a name new in both clusters
	if _, err := west.client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eastExecutor := east.token(t, ns, "executor", "flyte-services-executor", auth.DefaultAudience)
	westExecutor := west.token(t, ns, "executor", "flyte-services-executor", auth.DefaultAudience)
	westWrongAudience := west.token(t, ns, "other", "flyte-services-executor", "someone-else")
	westViewer := west.token(t, ns, "viewer", "flyte-services-viewer", auth.DefaultAudience)

	for _, tc := range []struct {
		name, token, cluster string
		want                 connect.Code
	}{
		{"east's executor, east's action", eastExecutor, "east", 0},
		{"west's executor, west's action", westExecutor, "west", 0},
		{"east's executor, west's action", eastExecutor, "west", connect.CodePermissionDenied},
		{"west's executor, east's action", westExecutor, "east", connect.CodePermissionDenied},
		{"west's executor, an action naming no cluster", westExecutor, "", connect.CodePermissionDenied},
		{"west's viewer", westViewer, "west", connect.CodePermissionDenied},
		{"west's token for another audience", westWrongAudience, "west", connect.CodeUnauthenticated},
		{"a token west's issuer never signed", forged(west.issuer), "west", connect.CodeUnauthenticated},
		{"a token of an issuer no cluster has", forged("https://elsewhere.example"), "west", connect.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			action := strings.NewReplacer(" ", "-", "'", "", ",", "").Replace(tc.name)
			if got := record(t, pki, url, tc.token, "p1", action, tc.cluster); got != tc.want {
				t.Errorf("recording an action of cluster %q: code %v, want %v", tc.cluster, got, tc.want)
			}
		})
	}

	// West goes away: east's executor records as before, its calls never reaching west.
	if err := west.env.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got := record(t, pki, url, eastExecutor, "p1", fmt.Sprintf("east-after-west-%d", i), "east"); got != 0 {
			t.Errorf("east's executor with west gone: code %v, want OK", got)
		}
	}
	// West's executor is refused while west cannot be asked, not let through.
	if got := record(t, pki, url, westExecutor, "p1", "west-gone", "west"); got != connect.CodeUnauthenticated {
		t.Errorf("west's executor with west's API server gone: code %v, want Unauthenticated", got)
	}

	// A service that knows east alone refuses west's executor: its token is east's to
	// review, and east did not issue it.
	pkiEastOnly, urlEastOnly := startEvents(t, pg)
	if got := record(t, pkiEastOnly, urlEastOnly, westExecutor, "p1", "west-unknown", "west"); got != connect.CodeUnauthenticated {
		t.Errorf("west's executor at a service that knows east alone: code %v, want Unauthenticated", got)
	}
	if got := record(t, pkiEastOnly, urlEastOnly, eastExecutor, "p1", "east-alone", "east"); got != 0 {
		t.Errorf("east's executor at a service that knows east alone: code %v, want OK", got)
	}
}
