// Package servicetest runs a service in-process for tests, the way its binary runs it,
// on loopback ports, and gives back what a client needs.
package servicetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/metricstest"
	"github.com/flytekube/backend/test/repo"
)

// H2CClient speaks HTTP/2 without TLS, as gRPC clients do inside a cluster: the
// programs' own client (internal/rpcclient), with no CA, token or timeout. Each call
// returns a new client and transport, which a test may adjust.
func H2CClient() *http.Client {
	c, err := rpcclient.New(rpcclient.Options{})
	if err != nil {
		panic(err) // it fails only reading files, and is given none
	}
	return c
}

// Instance is one running service.
type Instance struct {
	// URL is the RPC base URL.
	URL string
	// MetricsURL is the /metrics URL.
	MetricsURL string
	// HTTP is an HTTP/2 client for URL.
	HTTP *http.Client
	// Stop shuts the service down gracefully and waits for it; safe to call twice.
	Stop func()
	// CAFile and Token, once UseTLS is called, are what buf curl trusts and sends.
	CAFile, Token string
}

// UseTLS points the instance's URL and client at a service started with the PKI's
// certificate, sending token.
func (i *Instance) UseTLS(p *PKI, token string) {
	i.URL = strings.Replace(i.URL, "http://", "https://", 1)
	i.HTTP = p.Client(token)
	i.CAFile, i.Token = p.CAFile, token
}

// RunFunc starts a service; it must call started once serving and return when ctx ends.
type RunFunc func(ctx context.Context, started func(app.Addrs)) error

// Run runs a service as its binary does (run is cacheservice.Run or events.Run), on cfg
// changed by each of mutate, logging nowhere, until the test ends (or Stop).
func Run[C any](t testing.TB, run app.RunFunc[C], cfg C, mutate ...func(*C)) *Instance {
	t.Helper()
	for _, m := range mutate {
		m(&cfg)
	}
	return Start(t, func(ctx context.Context, started func(app.Addrs)) error {
		return run(ctx, cfg, slog.New(slog.DiscardHandler), started)
	})
}

// Start runs a service until the test ends (or Stop).
func Start(t testing.TB, run RunFunc) *Instance {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan app.Addrs, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(a app.Addrs) { started <- a }) }()
	var addrs app.Addrs
	select {
	case addrs = <-started:
	case err := <-done:
		cancel()
		t.Fatalf("service did not start: %v", err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatal("service did not start within a minute")
	}
	inst := &Instance{URL: "http://" + addrs.RPC.String(), HTTP: H2CClient()}
	if addrs.Metrics != nil {
		inst.MetricsURL = "http://" + addrs.Metrics.String() + "/metrics"
	}
	var once sync.Once
	inst.Stop = func() {
		once.Do(func() {
			// Closing our idle connection first spares the server's wait for clients to
			// hang up after its GOAWAY.
			inst.HTTP.CloseIdleConnections()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("service stopped with: %v", err)
			}
		})
	}
	t.Cleanup(inst.Stop)
	return inst
}

// Gatherer scrapes the service's /metrics, for prometheus/testutil's Gather* functions.
func (i *Instance) Gatherer() prometheus.Gatherer { return metricstest.Scrape(i.MetricsURL) }

// RequireMetrics fails the test for each sample the service's /metrics lacks or has
// with another value; a sample is a line of the text exposition format, such as
// `flyte_cache_gets_total{result="hit"} 2`.
func (i *Instance) RequireMetrics(t testing.TB, samples ...string) {
	t.Helper()
	metricstest.Require(t, i.Gatherer(), samples...)
}

// WaitForMetric reports whether the service's /metrics has the sample (as in
// RequireMetrics) within a minute.
func (i *Instance) WaitForMetric(t testing.TB, sample string) bool {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), eventually.Interval, time.Minute, true,
		func(context.Context) (bool, error) { return metricstest.Has(t, i.Gatherer(), sample), nil })
	return err == nil
}

// BufCurl runs `buf curl` (pinned in tools/go.mod) against the service with the gRPC
// protocol (over TLS with the instance's CA and token after UseTLS, else with HTTP/2
// prior knowledge), failing the test when it fails or takes more than five minutes (the
// first run may build buf). Reflection is the only schema it gets.
func (i *Instance) BufCurl(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := i.BufCurlCommand(t, ctx, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("buf curl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// BufCurlCommand is the command BufCurl runs, for callers that stream its output.
func (i *Instance) BufCurlCommand(t testing.TB, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	modfile, err := repo.Path("tools", "go.mod")
	if err != nil {
		t.Fatal(err)
	}
	flags := []string{"tool", "-modfile=" + modfile, "buf", "curl", "--protocol", "grpc"}
	if i.CAFile != "" {
		flags = append(flags, "--cacert", i.CAFile) // HTTP/2 is negotiated by ALPN
	} else {
		flags = append(flags, "--http2-prior-knowledge")
	}
	if i.Token != "" {
		// Reflection is authenticated too: '*' sends the same headers with it.
		flags = append(flags, "-H", "Authorization: Bearer "+i.Token, "--reflect-header", "*")
	}
	return exec.CommandContext(ctx, "go", append(flags, args...)...)
}

// SyncBuffer is a bytes.Buffer safe to read while a command or server writes to it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// RequireInvalidArgument fails the test unless err is InvalidArgument naming field the
// way protovalidate names one ("events[0].attempt: ...").
func RequireInvalidArgument(t testing.TB, err error, field string) {
	t.Helper()
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), field+":") {
		t.Fatalf("got %v; want InvalidArgument naming %s", err, field)
	}
}

// PostUnary posts a Connect unary request with a body built by hand (binary protobuf, or
// JSON when it starts with "{"), as a client that does not check what it sends would,
// and returns what the service answered: nil for a success, else an error with the
// answer's Connect code and, as its message, the whole answer, all a client would see.
func (i *Instance) PostUnary(t testing.TB, procedure string, body []byte) error {
	t.Helper()
	contentType := "application/proto"
	if bytes.HasPrefix(body, []byte("{")) {
		contentType = "application/json"
	}
	resp, err := i.HTTP.Post(i.URL+procedure, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var wire struct{ Code string }
	var code connect.Code
	if json.Unmarshal(answer, &wire) != nil || code.UnmarshalText([]byte(wire.Code)) != nil {
		t.Fatalf("status %d with an answer that is not a Connect error: %q", resp.StatusCode, answer)
	}
	return connect.NewError(code, errors.New(string(answer)))
}
