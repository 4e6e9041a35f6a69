package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/servicetest"
)

// testService is a small EventsService whose behaviour the tests steer.
type testService struct {
	eventsv1connect.UnimplementedEventsServiceHandler
	recordDelay time.Duration
	recordErr   error // what Record fails with, after its delay
}

func (s *testService) Record(ctx context.Context, req *connect.Request[eventsv1.RecordRequest]) (*connect.Response[eventsv1.RecordResponse], error) {
	select {
	case <-time.After(s.recordDelay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.recordErr != nil {
		return nil, s.recordErr
	}
	return connect.NewResponse(&eventsv1.RecordResponse{Recorded: uint32(len(req.Msg.GetEvents()))}), nil
}

func (s *testService) GetAction(_ context.Context, req *connect.Request[eventsv1.GetActionRequest]) (*connect.Response[eventsv1.GetActionResponse], error) {
	return connect.NewResponse(&eventsv1.GetActionResponse{Action: &eventsv1.Action{
		Id:    req.Msg.GetId(),
		Phase: flytecorev1.ActionPhase_ACTION_PHASE_RUNNING,
	}}), nil
}

func (s *testService) ListActions(context.Context, *connect.Request[eventsv1.ListActionsRequest]) (*connect.Response[eventsv1.ListActionsResponse], error) {
	panic("a handler bug")
}

// ListActionEvents fails with an error it does not classify, which says too much.
func (s *testService) ListActionEvents(context.Context, *connect.Request[eventsv1.ListActionEventsRequest]) (*connect.Response[eventsv1.ListActionEventsResponse], error) {
	return nil, errors.New(`table "secret_table" is gone`)
}

func (s *testService) WatchActions(ctx context.Context, req *connect.Request[eventsv1.WatchActionsRequest], stream *connect.ServerStream[eventsv1.WatchActionsResponse]) error {
	for i := range 3 {
		id := &flytecorev1.ActionIdentifier{Project: req.Msg.GetProject(), Domain: req.Msg.GetDomain(), Run: "r", Action: fmt.Sprintf("a%d", i)}
		if err := stream.Send(&eventsv1.WatchActionsResponse{Action: &eventsv1.Action{Id: id}}); err != nil {
			return err
		}
	}
	<-ctx.Done() // Like a real watch, the stream stays open until the client or server ends it.
	return ctx.Err()
}

type running struct {
	url    string
	http   *http.Client
	stop   context.CancelFunc
	served chan error
}

func start(t *testing.T, svc *testService) *running {
	t.Helper()
	return serve(t, server.Config{}, svc, slog.New(slog.DiscardHandler))
}

// serve serves svc with cfg's limits and TLS files on a loopback port until the test
// ends, logging to log.
func serve(t *testing.T, cfg server.Config, svc eventsv1connect.EventsServiceHandler, log *slog.Logger) *running {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.ShutdownTimeout, cfg.StreamDrainDelay = 5*time.Second, 200*time.Millisecond
	srv, err := server.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	server.Handle(srv, svc, eventsv1connect.NewEventsServiceHandler)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{url: "http://" + srv.Addr().String(), http: servicetest.H2CClient(), stop: cancel, served: make(chan error, 1)}
	go func() { r.served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

func validID() *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: "r1", Action: "a0"}
}

var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
}

func TestServesEveryProtocol(t *testing.T) {
	r := start(t, &testService{})
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			client := eventsv1connect.NewEventsServiceClient(r.http, r.url, p.opts...)

			got, err := client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: validID()}))
			if err != nil {
				t.Fatalf("GetAction: %v", err)
			}
			if got.Msg.GetAction().GetId().GetAction() != "a0" || got.Msg.GetAction().GetPhase() != flytecorev1.ActionPhase_ACTION_PHASE_RUNNING {
				t.Fatalf("GetAction = %v", got.Msg)
			}

			stream, err := client.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"}))
			if err != nil {
				t.Fatalf("WatchActions: %v", err)
			}
			var names []string
			for len(names) < 3 && stream.Receive() {
				names = append(names, stream.Msg().GetAction().GetId().GetAction())
			}
			if err := stream.Close(); err != nil {
				t.Fatalf("closing stream: %v", err)
			}
			if !slices.Equal(names, []string{"a0", "a1", "a2"}) {
				t.Fatalf("streamed %v, err %v", names, stream.Err())
			}
		})
	}
}

func TestGRPCGoClient(t *testing.T) {
	r := start(t, &testService{})
	conn, err := grpc.NewClient(strings.TrimPrefix(r.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := eventsv1.NewEventsServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := client.Record(ctx, &eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{validEvent()}})
	if err != nil || resp.GetRecorded() != 1 {
		t.Fatalf("Record = %v, %v; want 1 recorded", resp, err)
	}
	_, err = client.GetAction(ctx, &eventsv1.GetActionRequest{})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "id") {
		t.Fatalf("GetAction without id: %v; want InvalidArgument naming id", err)
	}
}

func validEvent() *eventsv1.ActionEvent {
	return &eventsv1.ActionEvent{
		Id:         validID(),
		Attempt:    1,
		Phase:      flytecorev1.ActionPhase_ACTION_PHASE_QUEUED,
		OccurredAt: timestamppb.Now(),
	}
}

func TestRejectsInvalidRequests(t *testing.T) {
	r := start(t, &testService{})
	client := eventsv1connect.NewEventsServiceClient(r.http, r.url, connect.WithGRPC())
	withEvent := func(mutate func(*eventsv1.ActionEvent)) *eventsv1.RecordRequest {
		ev := validEvent()
		mutate(ev)
		return &eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{ev}}
	}
	tests := []struct {
		name      string
		call      func(context.Context) error
		wantField string
	}{
		{"project not a DNS label", func(ctx context.Context) error {
			id := validID()
			id.Project = "Bad_Project"
			_, err := client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
			return err
		}, "id.project"},
		{"action name too long", func(ctx context.Context) error {
			id := validID()
			id.Action = strings.Repeat("a", 64)
			_, err := client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
			return err
		}, "id.action"},
		{"missing id", func(ctx context.Context) error {
			_, err := client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{}))
			return err
		}, "id"},
		{"attempt zero", func(ctx context.Context) error {
			_, err := client.Record(ctx, connect.NewRequest(withEvent(func(e *eventsv1.ActionEvent) { e.Attempt = 0 })))
			return err
		}, "events[0].attempt"},
		{"phase unspecified", func(ctx context.Context) error {
			_, err := client.Record(ctx, connect.NewRequest(withEvent(func(e *eventsv1.ActionEvent) { e.Phase = 0 })))
			return err
		}, "events[0].phase"},
		{"empty batch", func(ctx context.Context) error {
			_, err := client.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{}))
			return err
		}, "events"},
		{"page size too large", func(ctx context.Context) error {
			_, err := client.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", PageSize: 5000}))
			return err
		}, "page_size"},
		{"run filter not a DNS label", func(ctx context.Context) error {
			_, err := client.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", Run: "-r"}))
			return err
		}, "run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := tt.call(ctx)
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("got %v; want InvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tt.wantField+":") {
				t.Fatalf("error %q does not name field %q", err, tt.wantField)
			}
		})
	}
}

// A handler that panics, or fails with an error it did not classify, is answered with
// Internal and a generic message whose reference the log line has, with what went wrong.
func TestUnexpectedFailuresAreInternalAndLogged(t *testing.T) {
	tests := []struct {
		name, detail string
		call         func(eventsv1connect.EventsServiceClient) error
	}{
		{"panic", "a handler bug", func(c eventsv1connect.EventsServiceClient) error {
			_, err := c.ListActions(context.Background(), connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development"}))
			return err
		}},
		{"unclassified error", "secret_table", func(c eventsv1connect.EventsServiceClient) error {
			_, err := c.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: validID()}))
			return err
		}},
	}
	var logs servicetest.SyncBuffer
	r := serve(t, server.Config{}, &testService{}, slog.New(slog.NewTextHandler(&logs, nil)))
	for protocol, option := range map[string]connect.ClientOption{"gRPC": connect.WithGRPC(), "Connect": connect.WithProtoJSON()} {
		client := eventsv1connect.NewEventsServiceClient(r.http, r.url, option)
		for _, tt := range tests {
			t.Run(protocol+" "+tt.name, func(t *testing.T) {
				err := tt.call(client)
				var answer *connect.Error
				if !errors.As(err, &answer) || answer.Code() != connect.CodeInternal {
					t.Fatalf("got %v; want Internal", err)
				}
				if strings.Contains(answer.Message(), tt.detail) {
					t.Errorf("the answer %q tells the caller %q", answer.Message(), tt.detail)
				}
				_, ref, ok := strings.Cut(answer.Message(), "under ref ")
				if !ok || len(ref) != 32 {
					t.Fatalf("the answer %q gives no reference", answer.Message())
				}
				if line := grepLine(logs.String(), "ref="+ref); !strings.Contains(line, tt.detail) || !strings.Contains(line, "level=ERROR") {
					t.Errorf("the log line with ref %s does not say %q at level ERROR: %q", ref, tt.detail, line)
				}
			})
		}
	}
	// The server is still up.
	client := eventsv1connect.NewEventsServiceClient(r.http, r.url)
	if _, err := client.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{Id: validID()})); err != nil {
		t.Fatalf("after panic: %v", err)
	}
}

// A handler that fails with a context's error is answered with that error's own code,
// not as an internal failure.
func TestContextErrorsKeepTheirCode(t *testing.T) {
	tests := []struct {
		err  error
		want connect.Code
	}{
		{fmt.Errorf("reading: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded},
		{fmt.Errorf("reading: %w", context.Canceled), connect.CodeCanceled},
	}
	for _, tt := range tests {
		t.Run(tt.want.String(), func(t *testing.T) {
			r := start(t, &testService{recordErr: tt.err})
			client := eventsv1connect.NewEventsServiceClient(r.http, r.url, connect.WithGRPC())
			_, err := client.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{validEvent()}}))
			if connect.CodeOf(err) != tt.want {
				t.Fatalf("got %v; want %v", err, tt.want)
			}
		})
	}
}

func grepLine(text, substr string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, substr) {
			return line
		}
	}
	return ""
}

func TestReflectionAndHealth(t *testing.T) {
	r := start(t, &testService{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, opts := range [][]connect.ClientOption{{connect.WithGRPC()}, {connect.WithGRPCWeb()}} {
		stream := grpcreflect.NewClient(r.http, r.url, opts...).NewStream(ctx)
		names, err := stream.ListServices()
		if err != nil {
			t.Fatalf("ListServices: %v", err)
		}
		for _, want := range []string{eventsv1connect.EventsServiceName, grpchealth.HealthV1ServiceName} {
			if !slices.Contains(names, protoreflect.FullName(want)) {
				t.Fatalf("reflection lists %v; want %s", names, want)
			}
		}
		files, err := stream.FileContainingSymbol(eventsv1connect.EventsServiceName)
		if err != nil || len(files) == 0 {
			t.Fatalf("FileContainingSymbol: %d files, %v", len(files), err)
		}
		_, _ = stream.Close()
	}

	if got := healthStatus(t, r, ""); got != grpchealth.StatusServing {
		t.Fatalf("health = %d; want SERVING", got)
	}
	if got := healthStatus(t, r, eventsv1connect.EventsServiceName); got != grpchealth.StatusServing {
		t.Fatalf("health of %s = %d; want SERVING", eventsv1connect.EventsServiceName, got)
	}
}

func healthStatus(t *testing.T, r *running, service string) grpchealth.Status {
	t.Helper()
	resp, err := grpchealth.NewClient(r.http, r.url, connect.WithGRPC()).Check(context.Background(), &grpchealth.CheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.Status
}

func TestGracefulShutdown(t *testing.T) {
	r := start(t, &testService{recordDelay: 500 * time.Millisecond})
	client := eventsv1connect.NewEventsServiceClient(r.http, r.url, connect.WithGRPC())
	ctx := context.Background()

	stream, err := client.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"}))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if !stream.Receive() {
			t.Fatalf("stream ended early: %v", stream.Err())
		}
	}

	// A Record already in flight when shutdown begins must complete.
	var wg sync.WaitGroup
	var recordErr error
	wg.Go(func() {
		_, recordErr = client.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{validEvent()}}))
	})
	time.Sleep(100 * time.Millisecond)
	r.stop()

	// The open stream is ended by the server instead of holding shutdown forever.
	for stream.Receive() {
	}
	if connect.CodeOf(stream.Err()) != connect.CodeUnavailable {
		t.Fatalf("stream ended with %v; want Unavailable", stream.Err())
	}
	wg.Wait()
	if recordErr != nil {
		t.Fatalf("in-flight Record failed during shutdown: %v", recordErr)
	}
	select {
	case err := <-r.served:
		r.served <- err // for the cleanup
		if err != nil {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after shutdown")
	}
	// New calls are refused once the server is down.
	if _, err := client.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: validID()})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("after shutdown: %v; want Unavailable", err)
	}
}

// TestBufCurl drives the server with `buf curl`, as a user would, through reflection only.
func TestBufCurl(t *testing.T) {
	r := start(t, &testService{})
	modfile, err := repo.Path("tools", "go.mod")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bufCurl := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "-modfile=" + modfile, "buf", "curl", "--http2-prior-knowledge"}, args...)...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("buf curl: %v\n%s", err, out)
		}
		return string(out)
	}
	for _, protocol := range []string{"grpc", "connect", "grpcweb"} {
		out := bufCurl("--protocol", protocol, "--list-services", r.url)
		if !strings.Contains(out, eventsv1connect.EventsServiceName) {
			t.Fatalf("buf curl --protocol %s --list-services:\n%s", protocol, out)
		}
	}
	out := bufCurl("--protocol", "grpc", "-d", `{"id":{"project":"demo","domain":"development","run":"r1","action":"a0"}}`,
		r.url+"/flyte.events.v1.EventsService/GetAction")
	if !strings.Contains(out, `"ACTION_PHASE_RUNNING"`) {
		t.Fatalf("buf curl GetAction:\n%s", out)
	}
	out = bufCurl("--protocol", "grpc", r.url+"/grpc.health.v1.Health/Check")
	if !strings.Contains(out, `"SERVING"`) {
		t.Fatalf("buf curl Health/Check:\n%s", out)
	}
}
