package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/flytekube/backend/services/server"
)

// requireToken stands in for authentication: only "Bearer good" passes.
func requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "16") // Unauthenticated
			w.WriteHeader(http.StatusOK)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// TestHealthWatchIsAuthenticatedAndBounded: Check answers anyone, as kubelet probes
// need; Watch, which holds a stream open for as long as the caller likes, answers only
// an authenticated caller and only a few at once, and the held watches leave Check
// answering.
func TestHealthWatchIsAuthenticatedAndBounded(t *testing.T) {
	r := serve(t, server.Config{Middleware: requireToken}, &testService{}, slog.New(slog.DiscardHandler))
	conn, err := grpc.NewClient(strings.TrimPrefix(r.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	health := healthv1.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	withToken := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer good")

	// watch opens a watch and returns the code of its first answer (OK for a status).
	watch := func(ctx context.Context) (codes.Code, context.CancelFunc) {
		t.Helper()
		ctx, stop := context.WithCancel(ctx)
		stream, err := health.Watch(ctx, &healthv1.HealthCheckRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		return status.Code(err), stop
	}

	if got, stop := watch(ctx); got != codes.Unauthenticated {
		stop()
		t.Fatalf("a watch without a token: %v; want Unauthenticated", got)
	}
	const attempts = 64
	served, refused := 0, 0
	var stops []context.CancelFunc
	for range attempts {
		got, stop := watch(withToken)
		stops = append(stops, stop)
		switch got {
		case codes.OK:
			served++
		case codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("a watch with a token: %v", got)
		}
	}
	t.Logf("%d watches served, %d refused", served, refused)
	if served == 0 || refused == 0 {
		t.Fatalf("%d of %d watches held at once were served; want a few, and the rest refused", served, attempts)
	}
	if resp, err := health.Check(ctx, &healthv1.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthv1.HealthCheckResponse_SERVING {
		t.Fatalf("Check without a token while watches are held: %v, %v", resp, err)
	}
	for _, stop := range stops {
		stop()
	}
	// The watches' places are given back when they end.
	var got codes.Code
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var stop context.CancelFunc
		got, stop = watch(withToken)
		stop()
		if got == codes.OK {
			return
		}
	}
	t.Fatalf("a watch after the others ended: %v", got)
}

// TestHealthCheckBodyIsBounded: a Check, which needs no token, cannot make the server
// read a large message.
func TestHealthCheckBodyIsBounded(t *testing.T) {
	r := serve(t, server.Config{Middleware: requireToken}, &testService{}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body, closeBody := stalledEnvelope(8<<20, 8<<20)
	defer closeBody()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/grpc.health.v1.Health/Check", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := r.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	if got := grpcStatus(resp); got != "8" { // ResourceExhausted
		t.Fatalf("an 8 MiB Check: grpc-status %q; want 8 (ResourceExhausted)", got)
	}
}

func grpcStatus(resp *http.Response) string {
	if s := resp.Trailer.Get("Grpc-Status"); s != "" {
		return s
	}
	return resp.Header.Get("Grpc-Status")
}
