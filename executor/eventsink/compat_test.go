package eventsink

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/metricstest"
)

// olderReplica is an events service replica of an older release in front of the real
// service: while refusing, it refuses every Record as such a replica refuses what it
// does not know (protovalidate's words for a newer enum value); otherwise it hands the
// call to the real service, counting what that recorded and what it absorbed as
// already stored.
type olderReplica struct {
	eventsv1connect.UnimplementedEventsServiceHandler
	real     eventsv1connect.EventsServiceClient
	refusing atomic.Bool
	refusals atomic.Int64
	// refuses, when set, says which requests are refused while refusing; nil: all.
	refuses func(*eventsv1.RecordRequest) bool

	mu                   sync.Mutex
	recorded, duplicates uint32
}

func (o *olderReplica) Record(ctx context.Context, req *connect.Request[eventsv1.RecordRequest]) (*connect.Response[eventsv1.RecordResponse], error) {
	if o.refusing.Load() && (o.refuses == nil || o.refuses(req.Msg)) {
		o.refusals.Add(1)
		return nil, connect.NewError(connect.CodeInvalidArgument,
			errors.New("validation error: events[0].phase: value must be one of the defined enum values"))
	}
	res, err := o.real.Record(ctx, req)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.recorded += res.Msg.GetRecorded()
	o.duplicates += res.Msg.GetDuplicates()
	o.mu.Unlock()
	return res, nil
}

func (o *olderReplica) counts() (recorded, duplicates uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.recorded, o.duplicates
}

// startOlderReplica serves o over HTTP/2 (h2c) on loopback with the generated handler.
func startOlderReplica(t *testing.T, o *olderReplica) eventsv1connect.EventsServiceClient {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(eventsv1connect.NewEventsServiceHandler(o))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL, rpcclient.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sampleOf is the value of the series name whose label is value, in g; -1 when absent.
func sampleOf(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	samples, err := metricstest.Samples(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if string(s.Metric["__name__"]) == name && string(s.Metric[model.LabelName(label)]) == value {
			return float64(s.Value)
		}
	}
	return -1
}

// TestRefusedEventsAreHeldUntilAServerTakesThem: an events service that refuses an
// action's events as an older replica refuses a newer executor's (InvalidArgument) does
// not make the executor drop them. The action stays undelivered (so the collector keeps
// it, and a deleted one keeps its finalizer), its events are offered again with a
// growing backoff far past the five tries that once gave them up, the refusal shows in
// a gauge, a counter by code and a Warning Event on the action; and once a compatible
// server serves, every event is delivered, once.
func TestRefusedEventsAreHeldUntilAServerTakesThem(t *testing.T) {
	kube, err := kubetest.Start(kubetest.Options{TaskActions: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.Stop() })
	ns := kube.Namespace(t)
	recorder := eventRecorder(t, kube)

	svc := startEventsService(t)
	older := &olderReplica{real: svc.client}
	older.refusing.Store(true)
	m, reg := newMetrics(t)
	p := startPublisher(t, startOlderReplica(t, older), WithMetrics(m), WithRecorder(recorder),
		WithRefusalBackoff(10*time.Millisecond, 200*time.Millisecond))

	ta := created(t, kube.Client, ns, "newer", flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseSucceeded)
	if p.ReleaseWhenDelivered(deleted(ta)) {
		t.Fatal("released before anything was delivered")
	}
	const tries = 15 // three times the 5 refusals after which events were once given up
	eventually.True(t, time.Minute, func() bool { return older.refusals.Load() >= tries },
		func() string { return fmt.Sprintf("offered %d times; want at least %d", older.refusals.Load(), tries) })
	if p.Delivered(ta) {
		t.Fatal("refused events count as delivered: the collector would delete the action")
	}
	if got := sample(t, reg, "flyte_executor_events_refused_actions"); got != 1 {
		t.Errorf("flyte_executor_events_refused_actions = %v; want 1", got)
	}
	if got := sampleOf(t, reg, "flyte_executor_events_refusals_total", "code", "invalid_argument"); got < tries {
		t.Errorf("flyte_executor_events_refusals_total{code=invalid_argument} = %v; want at least %d", got, tries)
	}
	if got := sample(t, reg, "flyte_executor_events_refused_total"); got > 0 {
		t.Errorf("flyte_executor_events_refused_total = %v; nothing should have been given up on", got)
	}
	var ev *corev1.Event
	eventually.True(t, 30*time.Second, func() bool { ev = eventOf(t, kube.Client, ns, ta.UID, ReasonEventsHeld); return ev != nil },
		func() string { return "no EventsHeld Event on the action" })
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "3 events") || !strings.Contains(ev.Message, "defined enum values") {
		t.Errorf("the Event does not say what is held and why: %s %q", ev.Type, ev.Message)
	}

	older.refusing.Store(false) // a compatible replica serves again
	woken(t, p, ta.UID)
	if !p.Delivered(ta) || !p.ReleaseWhenDelivered(deleted(ta)) {
		t.Fatal("woken, but not delivered")
	}
	if recorded, duplicates := older.counts(); recorded != 3 || duplicates != 0 {
		t.Errorf("the events service recorded %d events and absorbed %d again; want the 3, once", recorded, duplicates)
	}
	if n := len(svc.events(ta)); n != 3 {
		t.Errorf("the events service holds %d events; want 3", n)
	}
	if got := sample(t, reg, "flyte_executor_events_refused_actions"); got != 0 {
		t.Errorf("flyte_executor_events_refused_actions = %v after delivery; want 0", got)
	}
}

// TestRefusedEventsAreGivenUpOnlyWhenConfigured: by default an action's refused events
// are never given up on; a limit of refusals set by an operator gives them up after it.
func TestRefusedEventsAreGivenUpOnlyWhenConfigured(t *testing.T) {
	svc := startEventsService(t)
	for _, c := range []struct {
		name     string
		opts     []Option
		released bool
	}{
		{name: "by default, held", opts: nil},
		{name: "with a limit of 2, given up", opts: []Option{WithMaxRefusals(2)}, released: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			older := &olderReplica{real: svc.client}
			older.refusing.Store(true)
			p := startPublisher(t, startOlderReplica(t, older), append(c.opts, WithRefusalBackoff(time.Millisecond, 10*time.Millisecond))...)
			ta := action("limit-"+strings.ReplaceAll(c.name, " ", ""), flytev1.PhaseQueued, flytev1.PhaseSucceeded)
			ta.UID = types.UID(ta.Name)
			p.Enqueue(ta)
			const tries = 20
			eventually.True(t, time.Minute, func() bool { return p.Delivered(ta) || older.refusals.Load() >= tries },
				func() string { return fmt.Sprintf("offered %d times", older.refusals.Load()) })
			if p.Delivered(ta) != c.released {
				t.Errorf("delivered (or given up on): %v after %d refusals; want %v", p.Delivered(ta), older.refusals.Load(), c.released)
			}
		})
	}
}

// eventOf is the Event of this reason about uid, if there is one.
func eventOf(t *testing.T, c client.Client, ns string, uid types.UID, reason string) *corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i, ev := range list.Items {
		if ev.InvolvedObject.UID == uid && ev.Reason == reason {
			return &list.Items[i]
		}
	}
	return nil
}

// TestHeldEventsWaitOutTheirBackoff: new history of an action whose events are held does
// not make the publisher offer them before their backoff ends, so a busy action is not
// refused (and its Warning Event recorded) at every status write, but once per step.
func TestHeldEventsWaitOutTheirBackoff(t *testing.T) {
	svc := startEventsService(t)
	older := &olderReplica{real: svc.client, refuses: func(req *eventsv1.RecordRequest) bool {
		for _, ev := range req.GetEvents() {
			if ev.GetId().GetAction() == "held" {
				return true
			}
		}
		return false
	}}
	older.refusing.Store(true)
	p := startPublisher(t, startOlderReplica(t, older), WithRefusalBackoff(time.Hour, time.Hour))
	p.Enqueue(action("held", flytev1.PhaseQueued, flytev1.PhaseRunning))
	eventually.True(t, 30*time.Second, func() bool { return older.refusals.Load() == 1 },
		func() string { return fmt.Sprintf("offered %d times; want the first offer", older.refusals.Load()) })

	// New history of the held action, then another action: once the other is delivered,
	// the queue has passed the held one.
	p.Enqueue(action("held", flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseSucceeded))
	other := action("other", flytev1.PhaseQueued, flytev1.PhaseSucceeded)
	p.Enqueue(other)
	eventually.True(t, 30*time.Second, func() bool { return p.Delivered(other) }, func() string { return "the other action was not delivered" })
	if n := older.refusals.Load(); n != 1 {
		t.Fatalf("the held action's events were offered %d times within their backoff of an hour; want once", n)
	}
}
