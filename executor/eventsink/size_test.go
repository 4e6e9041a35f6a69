package eventsink

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/servicetest"
)

// The publisher sizes its requests by the events service's read limit, which it cannot
// ask for: the two numbers must be one.
func TestRequestsAreSizedByTheEventsServicesReadLimit(t *testing.T) {
	if got := (events.Config{}).WithDefaults().Server.MaxMessageBytes; got != serviceReadLimit {
		t.Fatalf("the events service reads requests of up to %d bytes; the publisher assumes %d", got, serviceReadLimit)
	}
	if got := (server.Config{}).WithDefaults().MaxMessageBytes; got < serviceReadLimit {
		t.Fatalf("the RPC server reads at most %d bytes by default, less than the events service's %d", got, serviceReadLimit)
	}
	if maxRequestBytes >= serviceReadLimit || maxRequestBytes < serviceReadLimit*3/4 {
		t.Fatalf("requests are bounded to %d bytes; want a margin below %d, of at most a quarter", maxRequestBytes, serviceReadLimit)
	}
}

// largest fills every entry of ta's history to the CRD's limits: about 45 KB an event.
func largest(ta *flytev1.TaskAction) *flytev1.TaskAction {
	text := func(prefix string, n int) string { return prefix + strings.Repeat("x", n-len(prefix)) }
	for i := range ta.Status.PhaseHistory {
		h := &ta.Status.PhaseHistory[i]
		h.Reason = text("Reason", flytev1.MaxReasonLength)
		h.Message = text(fmt.Sprintf("entry %d: ", i), flytev1.MaxHistoryMessageLength)
		h.OutputsURI = text("s3://bucket/", flytev1.MaxLogLinkURILength)
		h.Error = &flytev1.ExecutionError{Code: text("E", flytev1.MaxErrorCodeLength), Kind: flytev1.ErrorKindUser,
			Message: text("failed: ", flytev1.MaxErrorMessageLength)}
		for j := range flytev1.MaxLogLinks {
			h.LogLinks = append(h.LogLinks, flytev1.LogLink{Name: text(fmt.Sprintf("logs-%d-", j), flytev1.MaxLogLinkNameLength),
				URI: text("https://logs.example.com/", flytev1.MaxLogLinkURILength)})
		}
		for j := range flytev1.MaxClusterEvents {
			h.ClusterEvents = append(h.ClusterEvents, flytev1.ClusterEvent{OccurredAt: metav1.Now(),
				Object: text(fmt.Sprintf("Pod/p-%d-", j), flytev1.MaxClusterEventObjectLength), Type: "Warning",
				Reason: text("Backoff", flytev1.MaxReasonLength), Message: text("back-off ", flytev1.MaxClusterEventMessageLength),
				Source: text("kubelet", flytev1.MaxClusterEventSourceLength), Count: 1})
		}
	}
	return ta
}

// history is an action of n entries in attempt 1: Running ones, then Succeeded.
func history(uid string, n int) *flytev1.TaskAction {
	phases := make([]flytev1.Phase, n)
	for i := range phases {
		phases[i] = flytev1.PhaseRunning
	}
	phases[n-1] = flytev1.PhaseSucceeded
	return action(uid, phases...)
}

// requests records what each Record call sent and how it ended.
type requests struct {
	mu        sync.Mutex
	largest   int
	calls     int
	exhausted int // refused with ResourceExhausted
}

func (r *requests) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			rec, ok := req.Any().(*eventsv1.RecordRequest)
			resp, err := next(ctx, req)
			if ok {
				r.mu.Lock()
				r.calls++
				r.largest = max(r.largest, proto.Size(rec))
				if connect.CodeOf(err) == connect.CodeResourceExhausted {
					r.exhausted++
				}
				r.mu.Unlock()
			}
			return resp, err
		}
	})
}

func (r *requests) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%d Record calls, the largest of %d bytes, %d refused with ResourceExhausted", r.calls, r.largest, r.exhausted)
}

// After a restart every finished action's history goes again, all at once. Events near
// their limits make a thousand of them far more than the events service reads in one
// request: they must be delivered in requests it reads, each action's in order, whether
// the publisher sized them right (the service's own limit) or the service still refuses
// them as too large (a smaller limit than the publisher knows: the requests are split).
func TestLargeEventsAreDeliveredInRequestsTheServiceReads(t *testing.T) {
	for _, c := range []struct {
		name string
		// readLimit is the events service's; zero is its default
		readLimit int
		// actions, of entries each
		actions, entries int
		// exhausted: some requests are refused as too large, then split
		exhausted bool
	}{
		{name: "a restart's backlog of many actions", actions: 30, entries: 10},
		{name: "one action's history larger than a request", actions: 1, entries: 256}, // the CRD's maxItems of phaseHistory,
		{name: "a service that reads less than the publisher assumes", readLimit: 256 << 10, actions: 8, entries: 10, exhausted: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := startEventsServiceWith(t, server.Config{MaxMessageBytes: c.readLimit})
			var sent requests
			client, err := NewClient(svc.inst.URL, rpcclient.Options{}, connect.WithInterceptors(sent.interceptor()))
			if err != nil {
				t.Fatal(err)
			}
			p := New(client, "test", clock.RealClock{}, slog.New(slog.DiscardHandler))
			var all []*flytev1.TaskAction
			bytes := 0
			for i := range c.actions {
				ta := largest(history(fmt.Sprintf("large-%d", i), c.entries))
				all = append(all, ta)
				for _, h := range ta.Status.PhaseHistory {
					bytes += proto.Size(p.toEvent(ta, h, nil))
				}
				// As after a restart: everything is handed over before delivery starts.
				p.Enqueue(ta)
			}
			t.Logf("%d actions of %d entries: %d events, %d bytes", c.actions, c.entries, c.actions*c.entries, bytes)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = p.Start(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			eventually.True(t, 2*time.Minute, func() bool {
				for _, ta := range all {
					if !p.Delivered(ta) {
						return false
					}
				}
				return true
			}, func() string { return "not every action was delivered: " + sent.String() })
			t.Log(sent.String())
			for _, ta := range all {
				stored := svc.events(ta)
				if len(stored) != c.entries {
					t.Fatalf("%s: the events service holds %d events; want %d", ta.Name, len(stored), c.entries)
				}
				for i, ev := range stored {
					if ev.GetVersion() != uint32(i) || !strings.HasPrefix(ev.GetMessage(), fmt.Sprintf("entry %d: ", i)) {
						t.Fatalf("%s: event %d is version %d (%.12q); want the history's entries in order", ta.Name, i, ev.GetVersion(), ev.GetMessage())
					}
				}
			}
			limit := cmp.Or(c.readLimit, serviceReadLimit)
			switch {
			case c.exhausted && sent.exhausted == 0:
				t.Errorf("no request was refused as too large by a service reading %d bytes: the case tests nothing", limit)
			case !c.exhausted && sent.exhausted > 0:
				t.Errorf("requests were refused as too large by a service reading %d bytes: %s", limit, sent.String())
			case !c.exhausted && sent.largest > maxRequestBytes:
				t.Errorf("a request of %d bytes; want at most %d", sent.largest, maxRequestBytes)
			}
		})
	}
}

// An event the events service refuses as too large even alone is given up on as an
// invalid one is, after the same tries (a Kubernetes Event, the counter, the log), and
// not retried for ever; the action's entries before and after it, and the other actions
// of its batch, are delivered.
func TestAnEventTooLargeAloneIsRefusedForGood(t *testing.T) {
	svc := startEventsServiceWith(t, server.Config{MaxMessageBytes: 16 << 10})
	m, reg := newMetrics(t)
	var logs servicetest.SyncBuffer
	p := New(svc.client, "test", clock.RealClock{}, slog.New(slog.NewTextHandler(&logs, nil)), WithMetrics(m), WithMaxRefusals(3))

	// The entry in the middle alone is about 45 KB.
	huge := action("huge", flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseSucceeded)
	huge.Status.PhaseHistory[1] = largest(action("x", flytev1.PhaseRunning)).Status.PhaseHistory[0]
	huge.Status.PhaseHistory[1].Version = 1
	var small []*flytev1.TaskAction
	for i := range 5 {
		small = append(small, action(fmt.Sprintf("small-%d", i), flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseSucceeded))
	}
	p.Enqueue(huge)
	for _, ta := range small {
		p.Enqueue(ta)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	eventually.True(t, time.Minute, func() bool { return p.Delivered(huge) }, func() string {
		return "the action with the event too large was never released:\n" + logs.String()
	})
	for _, ta := range small {
		eventually.True(t, 30*time.Second, func() bool { return p.Delivered(ta) },
			func() string { return ta.Name + ", which shared a batch with the event too large, was not delivered" })
	}
	var versions []uint32
	for _, ev := range svc.events(huge) {
		versions = append(versions, ev.GetVersion())
	}
	if fmt.Sprint(versions) != "[0 2]" {
		t.Errorf("the events service holds versions %v of the action; want the entries around the one too large, [0 2]", versions)
	}
	if got := sample(t, reg, "flyte_executor_events_refused_total"); got != 1 {
		t.Errorf("flyte_executor_events_refused_total = %v; want 1", got)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "giving up") {
		t.Errorf("no error logged for the refusal:\n%s", logs.String())
	}
}

// ResourceExhausted also says that the events service is overloaded right now (too many
// calls, or request bytes, in progress): that is an outage to wait out, not a request to
// split, and never a refusal of the events.
func TestAnOverloadedServiceIsWaitedOut(t *testing.T) {
	// One call at a time, held by a watch: every Record is refused as one too many.
	svc := startEventsServiceWith(t, server.Config{MaxConcurrentCalls: 1})
	wctx, endWatch := context.WithCancel(context.Background())
	defer endWatch()
	stream, err := svc.client.WatchActions(wctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"}))
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.ResponseHeader() // sent once the server holds the call
	t.Cleanup(func() { _ = stream.Close() })

	var sent requests
	client, err := NewClient(svc.inst.URL, rpcclient.Options{}, connect.WithInterceptors(sent.interceptor()))
	if err != nil {
		t.Fatal(err)
	}
	m, reg := newMetrics(t)
	var logs servicetest.SyncBuffer
	p := startPublisherOn(t, New(client, "test", clock.RealClock{}, slog.New(slog.NewTextHandler(&logs, nil)), WithMetrics(m), WithMaxRefusals(2)))
	var all []*flytev1.TaskAction
	for i := range 4 {
		ta := action(fmt.Sprintf("overloaded-%d", i), flytev1.PhaseQueued, flytev1.PhaseRunning)
		all = append(all, ta)
		p.Enqueue(ta)
	}
	// More refusals than any action has tries, were they counted as refusals.
	eventually.True(t, time.Minute, func() bool { sent.mu.Lock(); defer sent.mu.Unlock(); return sent.exhausted >= 6 },
		func() string { return "Record was not refused as one call too many: " + sent.String() })
	endWatch()
	for _, ta := range all {
		eventually.True(t, time.Minute, func() bool { return p.Delivered(ta) },
			func() string { return ta.Name + " was not delivered once the service had room: " + sent.String() })
	}
	// Read once every action is delivered: the service takes one call at a time, and a
	// read beside the publisher's last Records would be refused as one too many.
	for _, ta := range all {
		if n := len(svc.events(ta)); n != 2 {
			t.Errorf("%s: the events service holds %d events; want 2", ta.Name, n)
		}
	}
	if got := sample(t, reg, "flyte_executor_events_refused_total"); got != 0 {
		t.Errorf("flyte_executor_events_refused_total = %v; an overload refused events for good", got)
	}
	if strings.Contains(logs.String(), "too large") {
		t.Errorf("an overload was taken for a request too large:\n%s", logs.String())
	}
}

// startPublisherOn runs p until the test ends.
func startPublisherOn(t *testing.T, p *Publisher) *Publisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}
