package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/server"
)

// TestHandleProtectsEveryService: a service registered with Handle, which takes its
// generated constructor and not a ready handler, gets authentication, authorization,
// validation, read limits, tracing and panic recovery without its caller passing any
// option; there is no way left to register one without them.
func TestHandleProtectsEveryService(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	cfg := server.Config{
		MaxMessageBytes: 4 << 10,
		// Authentication: a bearer token, checked before the body is read.
		Middleware: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer good" {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusUnauthorized)
					_, _ = w.Write([]byte(`{"code":"unauthenticated","message":"no token"}`))
					return
				}
				next.ServeHTTP(w, r)
			})
		},
		// Authorization: nobody may list an action's events.
		Interceptors:   []connect.Interceptor{denyProcedure(eventsv1connect.EventsServiceListActionEventsProcedure)},
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
	}
	r := serve(t, cfg, &testService{}, slog.New(slog.DiscardHandler))
	withToken := connect.WithInterceptors(bearer("good"))
	tests := []struct {
		name   string
		token  bool
		call   func(context.Context, eventsv1connect.EventsServiceClient) error
		want   connect.Code
		detail string // in the error's message
	}{
		{"authentication", false, func(ctx context.Context, c eventsv1connect.EventsServiceClient) error {
			_, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: validID()}))
			return err
		}, connect.CodeUnauthenticated, ""},
		{"validation", true, func(ctx context.Context, c eventsv1connect.EventsServiceClient) error {
			_, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{}))
			return err
		}, connect.CodeInvalidArgument, "id"},
		{"authorization", true, func(ctx context.Context, c eventsv1connect.EventsServiceClient) error {
			_, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: validID()}))
			return err
		}, connect.CodePermissionDenied, "not allowed"},
		{"message size limit", true, func(ctx context.Context, c eventsv1connect.EventsServiceClient) error {
			ev := validEvent()
			ev.Message = strings.Repeat("x", 8<<10)
			_, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{ev}}))
			return err
		}, connect.CodeResourceExhausted, ""},
		{"panic recovery", true, func(ctx context.Context, c eventsv1connect.EventsServiceClient) error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development"}))
			return err
		}, connect.CodeInternal, ""},
		{"a call that passes every check", true, func(ctx context.Context, c eventsv1connect.EventsServiceClient) error {
			_, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: validID()}))
			return err
		}, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var opts []connect.ClientOption
			if tt.token {
				opts = append(opts, withToken)
			}
			err := tt.call(ctx, eventsv1connect.NewEventsServiceClient(r.http, r.url, opts...))
			if got := connect.CodeOf(err); (tt.want == 0 && err != nil) || (tt.want != 0 && got != tt.want) {
				t.Fatalf("got %v; want code %v", err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), tt.detail) {
				t.Fatalf("error %q does not say %q", err, tt.detail)
			}
		})
	}
	// Tracing: calls that reach the interceptors are server spans, refused and failed
	// ones included.
	traced := map[string]bool{}
	for _, s := range spans.Ended() {
		traced[s.Name()] = true
	}
	for _, want := range []string{eventsv1connect.EventsServiceGetActionProcedure, eventsv1connect.EventsServiceListActionEventsProcedure,
		eventsv1connect.EventsServiceListActionsProcedure} {
		want = strings.TrimPrefix(want, "/")
		if !traced[want] {
			t.Errorf("no span %s among %v", want, traced)
		}
	}
}

// TestHandleRefusesAnImplementationOfAnotherService: Handle's two type parameters are
// checked against each other when the service is registered, before anything serves.
func TestHandleRefusesAnImplementationOfAnotherService(t *testing.T) {
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p := recover()
		if msg, _ := p.(string); !strings.Contains(msg, "does not implement eventsv1connect.EgressServiceHandler") {
			t.Fatalf("recovered %v; want a panic naming the service", p)
		}
	}()
	server.Handle(srv, &testService{}, eventsv1connect.NewEgressServiceHandler)
}

// denyProcedure refuses one procedure, as an authorization interceptor does.
type denyProcedure string

func (d denyProcedure) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().Procedure == string(d) {
			return nil, connect.NewError(connect.CodePermissionDenied, errors.New("not allowed"))
		}
		return next(ctx, req)
	}
}

func (d denyProcedure) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (d denyProcedure) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// bearer sends a bearer token with every call.
func bearer(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}
}
