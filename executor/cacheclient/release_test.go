package cacheclient_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/metricstest"
)

// stallProxy forwards TCP connections on loopback to a service, and can stop passing
// bytes either way while keeping every connection open: a service that accepts and
// never answers (half-open, or partitioned), until it is let go again.
type stallProxy struct {
	addr string

	mu      sync.Mutex
	stalled bool
	resumed chan struct{} // closed when a stall ends
	conns   []net.Conn
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{addr: lis.Addr().String(), resumed: make(chan struct{})}
	close(p.resumed)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		_ = lis.Close()
		p.resume()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		conns.Wait()
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); p.pipe(up, c) }()
			go func() { defer conns.Done(); p.pipe(c, up) }()
		}
	}()
	return p
}

// pipe copies from src to dst, holding each chunk while the proxy is stalled.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			resumed := p.resumed
			p.mu.Unlock()
			<-resumed
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled, p.resumed = true, make(chan struct{})
	}
}

func (p *stallProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resumed)
	}
}

// The informer's delete handler lets go of a deleted action's reservation (Gone). A cache
// service that accepts calls and never answers must not hold it up: each such wait was
// the call's whole timeout, for every deleted action in turn, while the handler saw
// nothing else. The releases go out once the service answers again.
func TestReleasesOfGoneActionsDoNotWaitOnTheCacheService(t *testing.T) {
	e := newEnv(t)
	proxy := newStallProxy(t, strings.TrimPrefix(e.svc.URL, "http://"))
	client, err := cacheclient.NewClient("http://"+proxy.addr, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Fewer than the actions deleted: the others' releases are dropped, and counted.
	const queued = 3
	cc := cacheclient.New(client, e.store, cacheclient.Options{Heartbeat: time.Second, Log: slog.New(slog.DiscardHandler),
		Metrics: m, MaxQueuedReleases: queued})
	start(t, cc)
	ctx := context.Background()

	// Actions holding their reservations, each for a key of its own.
	const n = 5
	var actions []*flytev1.TaskAction
	for i := range n {
		inputs := e.uri(fmt.Sprintf("inputs-%d.json", i))
		e.write(t, inputs, fmt.Sprintf(`{"x": %d}`, i))
		ta := e.action(fmt.Sprintf("held-%d", i), inputs)
		if d := cc.Lookup(ctx, ta, e.uri(ta.Name+"/outputs.json")); d.Hit || d.Wait != 0 || !cc.Holds(ta.UID) {
			t.Fatalf("%s's lookup = %+v; want a miss holding the reservation", ta.Name, d)
		}
		actions = append(actions, ta)
	}

	// The service stops answering; the actions are deleted, one after the other, as the
	// informer hands their deletions to its handler.
	proxy.stall()
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		for _, ta := range actions {
			cc.Gone(ta.UID)
		}
	}()
	select {
	case <-handled:
	case <-time.After(5 * time.Second): // a tenth of what n calls of the client's timeout would take
		t.Fatal("the delete handler waited on a cache service that does not answer")
	}
	for _, ta := range actions {
		if cc.Holds(ta.UID) {
			t.Errorf("%s's reservation is still heartbeated after its deletion", ta.Name)
		}
	}

	if got := releases(t, reg, "dropped"); got != n-queued {
		t.Errorf("%v releases counted as dropped; want the %d over the queue's bound of %d", got, n-queued, queued)
	}

	// Once the service answers, every queued reservation is released (not left to
	// expire).
	proxy.resume()
	eventually.True(t, time.Minute, func() bool { return releases(t, reg, "released") == queued },
		func() string {
			return fmt.Sprintf("%v of %d queued reservations released", releases(t, reg, "released"), queued)
		})
	for _, ta := range actions[:queued] {
		e.requireReservationFree(t, cc, ta)
	}
	if got := releases(t, reg, "failed"); got != 0 {
		t.Errorf("%v releases failed on every try", got)
	}
}

// releases is flyte_executor_cache_releases_total{result}.
func releases(t *testing.T, g prometheus.Gatherer, result string) float64 {
	t.Helper()
	samples, err := metricstest.Samples(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if s.Metric["__name__"] == "flyte_executor_cache_releases_total" && string(s.Metric["result"]) == result {
			return float64(s.Value)
		}
	}
	return 0
}
