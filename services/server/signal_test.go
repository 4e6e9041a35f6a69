package server_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/servicetest"
)

// When set, the test binary acts as a server process instead of running tests.
const childEnv = "SERVER_TEST_CHILD"

func init() {
	if os.Getenv(childEnv) == "" {
		return
	}
	ctx, stop := server.SignalContext(context.Background())
	defer stop()
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	server.Handle(srv, &testService{recordDelay: time.Second}, eventsv1connect.NewEventsServiceHandler)
	fmt.Println("listening", srv.Addr())
	if err := srv.Serve(ctx); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func TestSIGTERMShutsDownGracefully(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening ") {
		t.Fatalf("child said %q, %v", line, err)
	}
	url := "http://" + strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	client := eventsv1connect.NewEventsServiceClient(servicetest.H2CClient(), url, connect.WithGRPC())

	// A Record that takes a second is in flight when SIGTERM arrives: it must complete,
	// and the process must then exit cleanly.
	done := make(chan error, 1)
	go func() {
		_, err := client.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{validEvent()}}))
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("in-flight Record: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("server process: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server process did not exit after SIGTERM")
	}
}
