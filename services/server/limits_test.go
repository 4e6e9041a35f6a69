package server_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/servicetest"
)

// startWith serves svc with cfg's limits on a loopback port.
func startWith(t *testing.T, cfg server.Config, svc eventsv1connect.EventsServiceHandler) string {
	t.Helper()
	return serve(t, cfg, svc, slog.New(slog.DiscardHandler)).url
}

// grpcRecord starts a gRPC Record call whose body is body: a client in full control of
// what it sends and when.
func grpcRecord(ctx context.Context, client *http.Client, url string, body io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+eventsv1connect.EventsServiceRecordProcedure, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	status := resp.Trailer.Get("Grpc-Status")
	if status == "" {
		status = resp.Header.Get("Grpc-Status")
	}
	if status != "0" {
		return fmt.Errorf("HTTP %d, grpc-status %q: %s", resp.StatusCode, status, resp.Trailer.Get("Grpc-Message"))
	}
	return nil
}

// stalledEnvelope sends sent bytes of a gRPC message declared as declared bytes long,
// then stops without ending the body.
func stalledEnvelope(declared, sent int) (io.Reader, func()) {
	pr, pw := io.Pipe()
	go func() {
		prefix := make([]byte, 5)
		binary.BigEndian.PutUint32(prefix[1:], uint32(declared))
		if _, err := pw.Write(prefix); err != nil {
			return
		}
		chunk := make([]byte, 64<<10)
		for n := 0; n < sent; n += len(chunk) {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
	}()
	return pr, func() { _ = pw.Close() }
}

// peakHeap samples the heap in use until stop is called and returns its peak.
func peakHeap() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); <-finished; return peak.Load() }
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestStalledBodiesAreClosedInBoundedMemory: 40 streams that send 7 MB of a declared
// 8 MB message and stop hold no more than the in-flight budget, and every one is ended
// by the body read deadline.
func TestStalledBodiesAreClosedInBoundedMemory(t *testing.T) {
	// Long enough for more than the budget to arrive before the first call ends, even
	// on a loaded machine under the race detector (at 2 s, once, it did not: 16 MiB in
	// 2 s is 8 MB/s across the clients).
	const readTimeout = 5 * time.Second
	url := startWith(t, server.Config{BodyReadTimeout: readTimeout, MaxInFlightBytes: 16 << 20}, &testService{})
	client := servicetest.H2CClient()
	before := heapInUse()
	stopSampling := peakHeap()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 40 {
		body, closeBody := stalledEnvelope(8<<20, 7<<20)
		defer closeBody()
		wg.Go(func() { errs <- grpcRecord(ctx, client, url, body) })
	}
	wg.Wait()
	took := time.Since(start)
	peak := stopSampling()
	close(errs)
	refused := 0
	for err := range errs {
		if err == nil {
			t.Error("a stalled call succeeded")
		} else if strings.Contains(err.Error(), `grpc-status "8"`) { // ResourceExhausted
			refused++
		}
	}
	// 280 MB cannot fit in a 16 MiB budget: calls that would go over it are refused at
	// once (how many depends on how fast the clients send), instead of being held until
	// the deadline.
	if refused == 0 {
		t.Error("no stalled call was refused: the in-flight budget held them all")
	}
	if took > readTimeout+10*time.Second {
		t.Errorf("the stalled calls ended after %s; the body read deadline is %s", took.Round(time.Millisecond), readTimeout)
	}
	// 40 × 7 MB would be 280 MB held (without the budget the heap grows by about 400 MiB
	// here); the budget allows 16 MB, plus the buffers of the refused reads, which are
	// garbage a busy machine collects late (about 100 MiB at the peak).
	if grown := int64(peak) - int64(before); grown > 200<<20 {
		t.Errorf("the heap grew by %d MiB while the bodies stalled; the in-flight budget is 16 MiB", grown>>20)
	}
}

// TestHalfSentRequestsDoNotHoldGoroutines: 20 connections each opening 50 streams that
// send headers and no body leave no goroutine behind once the body read deadline passes.
func TestHalfSentRequestsDoNotHoldGoroutines(t *testing.T) {
	const readTimeout = time.Second
	url := startWith(t, server.Config{BodyReadTimeout: readTimeout}, &testService{})
	baseline := runtime.NumGoroutine()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var closers []func()
	var clients []*http.Client
	closeIdle := func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}
	var mu sync.Mutex
	for range 20 {
		client := servicetest.H2CClient() // its own connection
		clients = append(clients, client)
		for range 50 {
			pr, pw := io.Pipe()
			mu.Lock()
			closers = append(closers, func() { _ = pw.Close() })
			mu.Unlock()
			wg.Go(func() { _ = grpcRecord(ctx, client, url, pr) })
		}
	}
	start := time.Now()
	wg.Wait() // every call was ended by the server
	if took := time.Since(start); took > readTimeout+10*time.Second {
		t.Errorf("the half-sent requests were ended after %s; the body read deadline is %s", took.Round(time.Millisecond), readTimeout)
	}
	for _, c := range closers {
		c()
	}
	// What may remain is the 20 idle connections, until the client hangs up.
	closeIdle()
	eventually.True(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= baseline+20 }, func() string {
		return fmt.Sprintf("%d goroutines remain, %d before the half-sent requests", runtime.NumGoroutine(), baseline)
	})
}

// TestTrickledHTTP1BodyIsClosed: an HTTP/1.1 body sent a byte at a time is cut off at the
// body read deadline.
func TestTrickledHTTP1BodyIsClosed(t *testing.T) {
	const readTimeout = time.Second
	url := startWith(t, server.Config{BodyReadTimeout: readTimeout, ReadHeaderTimeout: readTimeout}, &testService{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/proto\r\nContent-Length: 100000\r\n\r\n", eventsv1connect.EventsServiceRecordProcedure)
	start := time.Now()
	closed := make(chan struct{})
	answered := make(chan time.Duration, 1)
	go func() {
		defer close(closed)
		r := bufio.NewReader(conn)
		if _, err := r.ReadByte(); err == nil {
			answered <- time.Since(start)
		}
		_, _ = io.Copy(io.Discard, r)
	}()
	for time.Since(start) < 15*time.Second {
		select {
		case <-closed:
			// The call is answered at the body deadline; what the client trickles
			// after that is read as the next request's headers, under their deadline.
			if took := time.Since(start); took > 2*readTimeout+5*time.Second {
				t.Errorf("the connection closed after %s", took)
			}
			select {
			case took := <-answered:
				if took > readTimeout+5*time.Second {
					t.Errorf("answered after %s", took)
				}
			default:
			}
			return
		case <-time.After(100 * time.Millisecond):
			_, _ = conn.Write([]byte{0})
		}
	}
	t.Fatalf("a body trickled for 15 s was never cut off (deadline %s)", readTimeout)
}

// floodService sends large watch updates as fast as the client takes them.
type floodService struct {
	testService
	ended chan error
}

func (s *floodService) WatchActions(ctx context.Context, _ *connect.Request[eventsv1.WatchActionsRequest], stream *connect.ServerStream[eventsv1.WatchActionsResponse]) error {
	// Random text: compression must not shrink it, or the windows take long to fill.
	noise := make([]byte, 45<<10)
	_, _ = rand.Read(noise)
	msg := &eventsv1.WatchActionsResponse{Action: &eventsv1.Action{Message: base64.StdEncoding.EncodeToString(noise)}}
	for {
		if err := stream.Send(msg); err != nil {
			s.ended <- err
			return err
		}
	}
}

// TestStalledReaderIsDropped: a watcher that stops reading is ended by the write stall
// deadline, and its handler returns.
func TestStalledReaderIsDropped(t *testing.T) {
	svc := &floodService{ended: make(chan error, 1)}
	url := startWith(t, server.Config{WriteStallTimeout: time.Second}, svc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := eventsv1connect.NewEventsServiceClient(servicetest.H2CClient(), url, connect.WithGRPC()).
		WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Close() }()
	// Read one update and then nothing: the flow-control windows fill and the
	// handler's writes block.
	if !stream.Receive() {
		t.Fatalf("no first update: %v", stream.Err())
	}
	select {
	case err := <-svc.ended:
		t.Logf("the handler ended with %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the handler is still blocked sending to a client that stopped reading")
	}
}

// TestNegativeLimitsAreRefused: a negative limit would switch its protection off, and a
// window the transport does not take would be replaced by its default.
func TestNegativeLimitsAreRefused(t *testing.T) {
	for name, cfg := range map[string]server.Config{
		"body read timeout":   {BodyReadTimeout: -time.Second},
		"write stall timeout": {WriteStallTimeout: -time.Second},
		"concurrent streams":  {MaxConcurrentStreams: -1},
		"in-flight bytes":     {MaxInFlightBytes: -1},
		"connections":         {MaxConnections: -1},
		"health watches":      {MaxHealthWatches: -1},
		// The transport would take its own default for these, silently.
		"connection window too small":         {ConnReceiveWindow: 1 << 10},
		"connection window too large":         {ConnReceiveWindow: 4 << 20},
		"stream window over the connection's": {ConnReceiveWindow: 64 << 10, StreamReceiveWindow: 128 << 10},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Addr = "127.0.0.1:0"
			if _, err := server.New(cfg, slog.New(slog.DiscardHandler)); err == nil {
				t.Fatal("server.New accepted it")
			}
		})
	}
}

// TestConnectionsBeyondTheLimitWait: a connection past MaxConnections is not served
// until one of those served closes.
func TestConnectionsBeyondTheLimitWait(t *testing.T) {
	addr := strings.TrimPrefix(startWith(t, server.Config{MaxConnections: 2}, &testService{}), "http://")
	healthz := func(conn net.Conn, wait time.Duration) error {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(wait))
		if _, err := fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	dial := func() net.Conn {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	var served []net.Conn
	for range 2 {
		conn := dial()
		if err := healthz(conn, 5*time.Second); err != nil {
			t.Fatalf("a connection within the limit: %v", err)
		}
		served = append(served, conn) // kept alive, so still counted
	}
	third := dial()
	if _, err := fmt.Fprint(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	answer := bufio.NewReader(third)
	_ = third.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := answer.ReadByte(); err == nil {
		t.Fatal("a third connection was served while two were open")
	}
	_ = served[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := http.ReadResponse(answer, nil); err != nil {
		t.Fatalf("the third connection after one of the two closed: %v", err)
	}
}

// TestCallsBeyondTheLimitAreRefused: with MaxConcurrentCalls calls waiting for their
// bodies, one more is refused at once with ResourceExhausted.
func TestCallsBeyondTheLimitAreRefused(t *testing.T) {
	url := startWith(t, server.Config{MaxConcurrentCalls: 2}, &testService{})
	client := servicetest.H2CClient()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	// Two calls that wait for their bodies hold both places. One refused (a third took
	// its place first) calls again, until the test ends.
	var holders sync.WaitGroup
	defer holders.Wait()
	defer cancel()
	for range 2 {
		holders.Go(func() {
			for ctx.Err() == nil {
				body, closeBody := stalledEnvelope(1<<10, 0)
				_ = grpcRecord(ctx, client, url, body)
				closeBody()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	// Until both are in progress, a third may take a place and wait for its body.
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		body, closeBody := stalledEnvelope(1<<10, 0)
		err = grpcRecord(attempt, client, url, body)
		closeBody()
		cancelAttempt()
		if err != nil && strings.Contains(err.Error(), `grpc-status "8"`) {
			return
		}
		// The place it held goes back to a holder, which calls again sooner.
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("a third call while two wait for their bodies: %v; want ResourceExhausted", err)
}
