package executor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/servicetest"
)

// restartablePlane starts a control plane of the test's own whose API server can be
// stopped and started again on the same etcd, port and certificates, so that clients
// made before the outage work after it.
func restartablePlane(t *testing.T) (*envtest.Environment, client.Client) {
	t.Helper()
	assets, err := kubetest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	crds, err := repo.Path("deploy", "crd")
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := executor.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	plane := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: []string{crds}, ErrorIfCRDPathMissing: true, Scheme: scheme}
	// A directory of the test's, not one envtest makes and forgets on Stop: the restarted
	// API server then serves the certificate the clients already trust.
	plane.ControlPlane.APIServer = &envtest.APIServer{CertDir: t.TempDir()}
	if _, err := plane.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := plane.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	c, err := client.New(plane.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return plane, c
}

// TestExecutorWaitsForTheAPIServer: an executor started while the API server is down
// waits for it, saying so in its log and answering its liveness probe meanwhile, and runs
// actions once the server is back, instead of exiting at once and leaving its return to
// the kubelet's crash-loop back-off. The wait ends with its context, with an error that
// names the server.
func TestExecutorWaitsForTheAPIServer(t *testing.T) {
	plane, c := restartablePlane(t)
	apiServer := plane.ControlPlane.APIServer
	ctx := context.Background()
	ns := kubetest.Namespace(t, c)
	if err := apiServer.Stop(); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Namespaces = []string{ns}

	t.Run("gives up when its context ends", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := executor.Setup(ctx, cfg, plane.Config, slog.New(slog.DiscardHandler), inProcess())
		if err == nil || !strings.Contains(err.Error(), "waiting for the API server at "+plane.Config.Host) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Setup = %v; want it to give up at its deadline, naming %s", err, plane.Config.Host)
		}
	})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.HealthProbeBindAddress = lis.Addr().String()
	_ = lis.Close()
	var logs servicetest.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// Once the executor says it waits, its probes are checked and the API server started.
	duringCtx, endDuring := context.WithCancel(ctx)
	var during sync.WaitGroup
	var duringErr error
	defer during.Wait()
	defer endDuring() // first: a Setup that failed leaves nothing waiting
	during.Go(func() { duringErr = whileWaiting(duringCtx, &logs, cfg.HealthProbeBindAddress, apiServer.Start) })
	started := time.Now()
	kubetest.RunManager(t, func(ctx context.Context) (manager.Manager, error) {
		return executor.Setup(ctx, cfg, plane.Config, log, inProcess())
	})
	during.Wait()
	if duringErr != nil {
		t.Fatal(duringErr)
	}
	t.Logf("Setup returned after %s", time.Since(started).Round(time.Millisecond))
	for _, want := range []string{"level=WARN msg=\"waiting for the Kubernetes API server\" url=" + plane.Config.Host, "error=",
		"level=INFO msg=\"the Kubernetes API server answers\" url=" + plane.Config.Host} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}

	ta := &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: "after-outage", Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: "after-outage",
			TaskName: "demo.echo", TaskType: "core-echo", RunOutputBase: "mem://out/r1"},
	}
	if err := c.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, time.Minute, func() bool {
		return c.Get(ctx, client.ObjectKeyFromObject(ta), ta) == nil && ta.Status.Phase == flytev1.PhaseSucceeded
	}, func() string { return "the action did not succeed after the outage: " + string(ta.Status.Phase) })
}

// whileWaiting waits for the executor to log that it waits for the API server, checks
// that its liveness probe passes while its readiness probe fails, and a little later
// starts the API server.
func whileWaiting(ctx context.Context, logs *servicetest.SyncBuffer, healthAddr string, startAPIServer func() error) error {
	for !strings.Contains(logs.String(), "waiting for the Kubernetes API server") {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the executor never said it waits for the API server: %s", logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	var errs []error
	for path, want := range map[string]int{"/healthz": http.StatusOK, "/readyz": http.StatusServiceUnavailable} {
		resp, err := http.Get("http://" + healthAddr + path)
		if err != nil {
			errs = append(errs, fmt.Errorf("GET %s while waiting: %w", path, err))
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			errs = append(errs, fmt.Errorf("GET %s while waiting = %d %q; want %d", path, resp.StatusCode, body, want))
		}
	}
	select {
	case <-ctx.Done():
		return errors.Join(append(errs, ctx.Err())...)
	case <-time.After(2 * time.Second):
	}
	if err := startAPIServer(); err != nil {
		errs = append(errs, fmt.Errorf("restarting the API server: %w", err))
	}
	return errors.Join(errs...)
}
