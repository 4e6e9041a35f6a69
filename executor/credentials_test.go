package executor_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/pgtest"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/internal/servicetest"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
)

// TestExecutorReachesServicesWithTLSAndToken runs both services as a cluster would:
// TLS with a certificate from a private CA and token-file authentication. An executor
// given that CA (serviceCAFile) and an executor's token (serviceTokenFile) caches and
// reports its actions; one holding a viewer's token may read the cache but neither
// store outputs in it nor record events, so it is the token that lets the first through.
func TestExecutorReachesServicesWithTLSAndToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caPEM, certPEM, keyPEM := serverCertificate(t)
	caFile := write("ca.crt", caPEM)
	tls := server.Config{TLSCertFile: write("tls.crt", certPEM), TLSKeyFile: write("tls.key", keyPEM)}
	tokens := auth.Config{Mode: auth.ModeTokenFile, TokenFile: write("tokens.csv",
		"executor-token,flyte-executor,uid-1,\"flyte:executors\"\nviewer-token,viewer,uid-2,\"flyte:viewers\"\n")}

	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	log := slog.New(slog.DiscardHandler)
	eventsURL := httpsURL(servicetest.Start(t, func(ctx context.Context, started func(app.Addrs)) error {
		return events.Run(ctx, events.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Server: tls, Auth: tokens}, log, started)
	}))
	cacheURL := httpsURL(servicetest.Start(t, func(ctx context.Context, started func(app.Addrs)) error {
		return cacheservice.Run(ctx, cacheservice.Config{Listen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t), Server: tls, Auth: tokens}, log, started)
	}))
	executorWith := func(token string) (namespace string) {
		cfg := testConfig()
		cfg.EventsServiceURL, cfg.CacheServiceURL = eventsURL, cacheURL
		cfg.ServiceCAFile, cfg.ServiceTokenFile = caFile, write(token, token+"\n")
		cfg.Storage.AllowedPrefixes = []string{"mem://out/"}
		ns := env.Namespace(t)
		var count atomic.Int64
		run(t, cfg, ns, &count)
		return ns
	}
	viewerHTTP, err := rpcclient.New(rpcclient.Options{CAFile: caFile, TokenFile: write("viewer", "viewer-token")})
	if err != nil {
		t.Fatal(err)
	}
	viewer := eventsv1connect.NewEventsServiceClient(viewerHTTP, eventsURL)

	ns := executorWith("executor-token")
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

	nsViewer := executorWith("viewer-token")
	refused := cachedEcho(nsViewer, "refused")
	refused.Spec.TaskName = "demo.echo-refused"
	if err := env.Client.Create(context.Background(), refused); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client.ObjectKeyFromObject(refused), flytev1.PhaseSucceeded)
	var got flytev1.TaskAction
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(refused), &got); err == nil && got.Status.CacheStatus == flytev1.CachePutFailure {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.Status.CacheStatus != flytev1.CachePutFailure {
		t.Fatalf("with a viewer's token: cache status %s; want PutFailure (a viewer may not write the cache)", got.Status.CacheStatus)
	}
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

// serverCertificate makes a private CA and a certificate it signed for 127.0.0.1, as
// cert-manager would issue for a Service; all PEM.
func serverCertificate(t *testing.T) (caPEM, certPEM, keyPEM string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	caKey, leafKey := newKey(), newKey()
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "flyte test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "flyte services"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	encode := func(kind string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}))
	}
	return encode("CERTIFICATE", caDER), encode("CERTIFICATE", leafDER), encode("PRIVATE KEY", keyDER)
}
