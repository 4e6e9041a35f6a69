// Package eventsrelease runs a previous release's events service as a process of its
// own, on loopback, for the test and the benchmark of the events store's migration
// while that release keeps serving (events/online_migration_test.go,
// bench/cmd/events-bench --only migration).
package eventsrelease

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/process"
	"github.com/flytekube/backend/test/release"
	"github.com/flytekube/backend/test/repo"
)

// Binary builds (once, cached: minutes the first time) the events program of the
// release named version in RELEASES, and returns its path.
func Binary(ctx context.Context, version string) (string, error) {
	root, err := repo.Root()
	if err != nil {
		return "", err
	}
	r, err := release.Find(root, version)
	if err != nil {
		return "", err
	}
	b, err := release.Get(ctx, root, r)
	if err != nil {
		return "", err
	}
	return b.Binary("events"), nil
}

// Service is a running events service of a release.
type Service struct {
	// URL is its RPC base URL (h2c on 127.0.0.1).
	URL string
	// Client calls it over gRPC.
	Client eventsv1connect.EventsServiceClient
	proc   *process.Process
}

// Start runs binary against databaseURL (it applies its own migrations first), with no
// authentication, its log appended to logPath, and the extra flags args; it returns
// once the service answers.
func Start(ctx context.Context, binary, databaseURL, logPath string, args ...string) (*Service, error) {
	port, err := ports.Free(1)
	if err != nil {
		return nil, fmt.Errorf("eventsrelease: %w", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port[0])
	p := process.New("events", binary, filepath.Dir(logPath), nil, append([]string{
		"--listen", addr, "--metrics-listen", "", "--database-url", databaseURL, "--auth-mode", "none",
	}, args...)...)
	p.Log = logPath
	// A test binary that dies (a panic, a timeout) takes the service with it, gracefully.
	p.DeathSignal = syscall.SIGTERM
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("eventsrelease: %w", err)
	}
	s := &Service{URL: "http://" + addr, proc: p}
	httpClient, err := rpcclient.New(rpcclient.Options{})
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.Client = eventsv1connect.NewEventsServiceClient(httpClient, s.URL, connect.WithGRPC())
	if err := s.waitServing(ctx); err != nil {
		s.Stop()
		return nil, fmt.Errorf("eventsrelease: %s did not start: %w", binary, err)
	}
	return s, nil
}

// waitServing asks for an action no one records until the answer is the service's own.
func (s *Service) waitServing(ctx context.Context) error {
	probe := &eventsv1.GetActionRequest{Id: &flytecorev1.ActionIdentifier{Project: "probe", Domain: "probe", Run: "probe", Action: "probe"}}
	var last error
	err := s.proc.WaitFor(ctx, time.Minute, "serve", func(ctx context.Context) bool {
		_, last = s.Client.GetAction(ctx, connect.NewRequest(probe))
		return last == nil || connect.CodeOf(last) == connect.CodeNotFound
	})
	if err != nil {
		return fmt.Errorf("%w; last answer: %v", err, last)
	}
	return nil
}

// Stop asks the service to shut down and waits for it (killing it after 30 s).
func (s *Service) Stop() { s.proc.Stop(30 * time.Second) }
