// Package eventsrelease runs a previous release's events service as a process of its
// own, on loopback, for the test and the benchmark of the events store's migration
// while that release keeps serving (events/online_migration_test.go,
// bench/cmd/events-bench --only migration).
package eventsrelease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
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
	cmd    *exec.Cmd
	done   chan error
}

// Start runs binary against databaseURL (it applies its own migrations first), with no
// authentication, its log appended to logPath, and the extra flags args; it returns
// once the service answers.
func Start(ctx context.Context, binary, databaseURL, logPath string, args ...string) (*Service, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("eventsrelease: %w", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(binary, append([]string{
		"--listen", addr, "--metrics-listen", "", "--database-url", databaseURL, "--auth-mode", "none",
	}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A test binary that dies (a panic, a timeout) takes the service with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("eventsrelease: starting %s: %w", binary, err)
	}
	s := &Service{URL: "http://" + addr, cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait(); _ = logFile.Close() }()
	httpClient, err := rpcclient.New(rpcclient.Options{})
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.Client = eventsv1connect.NewEventsServiceClient(httpClient, s.URL, connect.WithGRPC())
	if err := s.waitServing(ctx); err != nil {
		s.Stop()
		return nil, fmt.Errorf("eventsrelease: %s did not start (its log: %s): %w", binary, logPath, err)
	}
	return s, nil
}

// waitServing asks for an action no one records until the answer is the service's own.
func (s *Service) waitServing(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	probe := &eventsv1.GetActionRequest{Id: &flytecorev1.ActionIdentifier{Project: "probe", Domain: "probe", Run: "probe", Action: "probe"}}
	for {
		_, err := s.Client.GetAction(ctx, connect.NewRequest(probe))
		if err == nil || connect.CodeOf(err) == connect.CodeNotFound {
			return nil
		}
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("exited: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("%w; last answer: %v", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop asks the service to shut down and waits for it (killing it after 30 s).
func (s *Service) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		err := <-s.done
		s.done <- err
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("eventsrelease: finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	tcp, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("eventsrelease: not a TCP address")
	}
	return tcp.Port, nil
}
