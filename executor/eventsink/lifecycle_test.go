package eventsink

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/metrics"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/metricstest"
	"github.com/flytekube/backend/test/servicetest"
)

// eventsService is a real events service on a database of its own, which a test can stop
// and start again on the same address (an outage).
type eventsService struct {
	t      *testing.T
	db     string
	server server.Config // the RPC server's limits; zero takes the service's defaults
	inst   *servicetest.Instance
	client eventsv1connect.EventsServiceClient // the publisher's
	reader eventsv1connect.EventsServiceClient // the test's checks'
}

func startEventsService(t *testing.T) *eventsService {
	t.Helper()
	return startEventsServiceWith(t, server.Config{})
}

// startEventsServiceWith starts an events service whose RPC server has the limits of srv.
func startEventsServiceWith(t *testing.T, srv server.Config) *eventsService {
	t.Helper()
	s := &eventsService{t: t, db: pg.NewDatabase(t), server: srv}
	s.run("127.0.0.1:0")
	c, err := NewClient(s.inst.URL, rpcclient.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.client = c
	// The test's own reads: a page of the largest events (8 MiB) took over 2 s once,
	// under -race on a loaded machine; the publisher's calls keep their 2 s.
	if s.reader, err = NewClient(s.inst.URL, rpcclient.Options{Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *eventsService) run(listen string) {
	s.inst = servicetest.Run(s.t, events.Run, events.Config{Listen: listen, DatabaseURL: s.db, Auth: auth.Config{Mode: auth.ModeNone}, Server: s.server})
}

func (s *eventsService) stop() { s.inst.Stop() }

// restart serves again on the address it had.
func (s *eventsService) restart() { s.run(strings.TrimPrefix(s.inst.URL, "http://")) }

// events lists every event the service stored for ta's action.
func (s *eventsService) events(ta *flytev1.TaskAction) []*eventsv1.ActionEvent {
	s.t.Helper()
	var all []*eventsv1.ActionEvent
	token := ""
	for {
		resp, err := s.reader.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{
			Id: identifier(ta), PageSize: 1000, PageToken: token}))
		if err != nil {
			s.t.Fatalf("listing the events of %s: %v", ta.Name, err)
		}
		all = append(all, resp.Msg.Events...)
		if token = resp.Msg.NextPageToken; token == "" {
			return all
		}
	}
}

// phase is the phase the service holds for ta's action; unspecified when it has none.
func (s *eventsService) phase(ta *flytev1.TaskAction) flytecorev1.ActionPhase {
	s.t.Helper()
	resp, err := s.reader.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{Id: identifier(ta)}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED
	}
	if err != nil {
		s.t.Fatalf("getting %s: %v", ta.Name, err)
	}
	return resp.Msg.Action.Phase
}

func identifier(ta *flytev1.TaskAction) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName}
}

// startPublisher runs a publisher on c until the test ends.
func startPublisher(t *testing.T, c eventsv1connect.EventsServiceClient, opts ...Option) *Publisher {
	t.Helper()
	p := New(c, "test", clock.RealClock{}, slog.New(slog.DiscardHandler), opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Start(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// sample is the value of the series name (without labels) in g; -1 when absent.
func sample(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	samples, err := metricstest.Samples(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if string(s.Metric["__name__"]) == name {
			return float64(s.Value)
		}
	}
	return -1
}

func newMetrics(t *testing.T) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// sizes is how much the publisher holds: its states and its names.
func (p *Publisher) sizes() (states, names int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.states), len(p.names)
}

// The backlog gauge is what the outage alert watches: while the events service is away,
// the actions waiting sit in the queue's rate limiter, not among its ready items, and
// must still count.
func TestTheUndeliveredGaugeCountsActionsWaitingThroughAnOutage(t *testing.T) {
	svc := startEventsService(t)
	svc.stop()
	m, reg := newMetrics(t)
	p := startPublisher(t, svc.client, WithMetrics(m))
	const n = 3
	for i := range n {
		p.Enqueue(action(fmt.Sprintf("outage-%d", i), flytev1.PhaseQueued, flytev1.PhaseRunning))
	}
	eventually.True(t, 30*time.Second, func() bool { return sample(t, reg, "flyte_executor_events_delivery_failures_total") >= 2 },
		func() string { return "no delivery failed with the events service down" })
	// Through retries, the gauge holds every waiting action.
	for range 20 {
		if got := sample(t, reg, "flyte_executor_events_undelivered_actions"); got != n {
			t.Fatalf("flyte_executor_events_undelivered_actions = %v during the outage; want %d", got, n)
		}
		time.Sleep(25 * time.Millisecond)
	}
	svc.restart()
	eventually.True(t, 60*time.Second, func() bool { return sample(t, reg, "flyte_executor_events_undelivered_actions") == 0 },
		func() string { return "the gauge did not drain once the events service was back" })
}

// withLogLink gives ta's last entry a log link; "not a URI" is refused by the events
// service as invalid.
func withLogLink(ta *flytev1.TaskAction, uri string) *flytev1.TaskAction {
	h := &ta.Status.PhaseHistory[len(ta.Status.PhaseHistory)-1]
	h.LogLinks = []flytev1.LogLink{{Name: "logs", URI: uri}}
	return ta
}

// A refused event must not pin its deleted action in Terminating: after a few tries the
// refusal is recorded (a Kubernetes Event on the action, a counter, an error in the log)
// and the action is released, while the others of its batch are delivered as usual.
func TestARefusedActionIsRecordedAndReleased(t *testing.T) {
	kube, err := kubetest.Start(kubetest.Options{TaskActions: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.Stop() })
	ns := kube.Namespace(t)
	recorder := eventRecorder(t, kube)

	svc := startEventsService(t)
	m, reg := newMetrics(t)
	var logs servicetest.SyncBuffer
	p := New(svc.client, "test", clock.RealClock{}, slog.New(slog.NewTextHandler(&logs, nil)),
		WithMetrics(m), WithRecorder(recorder), WithMaxRefusals(3))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	bad := withLogLink(created(t, kube.Client, ns, "bad", flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseAborted), "not a URI")
	good := created(t, kube.Client, ns, "good", flytev1.PhaseQueued, flytev1.PhaseSucceeded)
	p.Enqueue(good)
	if p.ReleaseWhenDelivered(deleted(bad)) {
		t.Fatal("released before anything was delivered")
	}
	go func() { _ = p.Start(ctx) }()

	woken(t, p, bad.UID)
	if !p.ReleaseWhenDelivered(deleted(bad)) || !p.Delivered(bad) {
		t.Error("woken, but not released")
	}
	eventually.True(t, 30*time.Second, func() bool { return p.Delivered(good) }, func() string { return "the good action was not delivered" })
	if n := len(svc.events(bad)); n != 0 {
		t.Errorf("the events service stored %d refused events", n)
	}
	if got := sample(t, reg, "flyte_executor_events_refused_total"); got != 3 {
		t.Errorf("flyte_executor_events_refused_total = %v; want 3", got)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "refused") {
		t.Errorf("no error logged for the refusal:\n%s", logs.String())
	}

	var ev *corev1.Event
	eventually.True(t, 30*time.Second, func() bool { ev = refusal(t, kube.Client, ns, bad.UID); return ev != nil },
		func() string { return "no EventsRefused Event on the refused action" })
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "3 events") || !strings.Contains(ev.Message, "log_links") {
		t.Errorf("the Event does not say what was refused and why: %s %q", ev.Type, ev.Message)
	}
	if len(ev.Message) > maxEventMessage {
		t.Errorf("the Event's message is %d bytes; at most %d", len(ev.Message), maxEventMessage)
	}
	if refusal(t, kube.Client, ns, good.UID) != nil {
		t.Error("an EventsRefused Event on the action that was delivered")
	}
}

// eventRecorder records Kubernetes Events to kube's API server, as the manager's does.
func eventRecorder(t *testing.T, kube *kubetest.Env) record.EventRecorder {
	t.Helper()
	cs, err := kubernetes.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	return b.NewRecorder(kube.Scheme, corev1.EventSource{Component: "flyte-executor"})
}

// created creates action(name, phases...) in ns with its status, so that an Event can
// refer to it.
func created(t *testing.T, c client.Client, ns, name string, phases ...flytev1.Phase) *flytev1.TaskAction {
	t.Helper()
	want := action(name, phases...)
	ta := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: want.Spec}
	ta.Spec.RunOutputBase = "mem://out/run"
	if err := c.Create(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	ta.Status = want.Status
	if err := c.Status().Update(context.Background(), ta); err != nil {
		t.Fatal(err)
	}
	return ta
}

// refusal is the EventsRefused Event about uid, if there is one.
func refusal(t *testing.T, c client.Client, ns string, uid types.UID) *corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i, ev := range list.Items {
		if ev.InvolvedObject.UID == uid && ev.Reason == ReasonEventsRefused {
			return &list.Items[i]
		}
	}
	return nil
}

// An action that vanishes unfinished (deleted without its finalizer, or re-created under
// its name) ends Aborted in the events service, from what the publisher last knew of it;
// one that finished keeps its outcome.
func TestAnActionThatVanishesUnfinishedEndsAborted(t *testing.T) {
	for _, c := range []struct {
		name string
		// outage: the events service is down until the action is gone
		outage bool
		// phases handed over before it vanished
		phases []flytev1.Phase
		// recreated: a new incarnation takes its name instead of Forget; sameID: it
		// has the same identity in the events service, whose record it continues
		recreated, sameID bool
		want              flytecorev1.ActionPhase
	}{
		{name: "running, delivered, then deleted", phases: []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseRunning},
			want: flytecorev1.ActionPhase_ACTION_PHASE_ABORTED},
		{name: "running, deleted during an outage", outage: true, phases: []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseRunning},
			want: flytecorev1.ActionPhase_ACTION_PHASE_ABORTED},
		{name: "running, re-created under its name", recreated: true, phases: []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseRunning},
			want: flytecorev1.ActionPhase_ACTION_PHASE_ABORTED},
		{name: "running, re-created under its name as the same action", recreated: true, sameID: true,
			phases: []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseRunning}, want: flytecorev1.ActionPhase_ACTION_PHASE_RUNNING},
		{name: "succeeded, then deleted", phases: []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseSucceeded},
			want: flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED},
		{name: "succeeded, deleted during an outage", outage: true, phases: []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseSucceeded},
			want: flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := startEventsService(t)
			if c.outage {
				svc.stop()
			}
			p := startPublisher(t, svc.client)
			ta := action("vanishing", c.phases...)
			p.Enqueue(ta)
			if !c.outage {
				eventually.True(t, 30*time.Second, func() bool { return p.Delivered(ta) }, func() string { return "not delivered" })
			}
			before := time.Now()
			if c.recreated {
				again := action("vanishing", flytev1.PhaseQueued)
				again.UID = "vanishing-2"
				if !c.sameID {
					again.Spec.RunName = "run-2"
				}
				p.Enqueue(again)
				eventually.True(t, 30*time.Second, func() bool { return p.Delivered(again) }, func() string { return "not delivered" })
			} else {
				p.Forget(keyOf(ta))
			}
			if c.outage {
				svc.restart()
			}
			eventually.True(t, 60*time.Second, func() bool { return svc.phase(ta) == c.want },
				func() string { return fmt.Sprintf("the events service holds %v; want %v", svc.phase(ta), c.want) })
			evs := svc.events(ta)
			if c.want != flytecorev1.ActionPhase_ACTION_PHASE_ABORTED {
				if len(evs) != len(c.phases) {
					t.Errorf("%d events stored; want the %d handed over", len(evs), len(c.phases))
				}
				return
			}
			if len(evs) != len(c.phases)+1 {
				t.Fatalf("%d events stored; want the %d handed over and Aborted", len(evs), len(c.phases))
			}
			end, aborted := evs[len(evs)-2], evs[len(evs)-1]
			if aborted.Phase != flytecorev1.ActionPhase_ACTION_PHASE_ABORTED || aborted.Attempt != end.Attempt ||
				aborted.Version != end.Version+1 || aborted.Reason != flytev1.ReasonAborted ||
				!strings.Contains(aborted.Message, "deleted before it finished") || aborted.OccurredAt.AsTime().Before(before) {
				t.Errorf("the closing event is %v", aborted)
			}
		})
	}
}

// The publisher holds a state per action only while the action exists: whichever way
// an action goes, nothing of it is left once it is gone and its history delivered.
func TestStatesDoNotOutliveTheirActions(t *testing.T) {
	for _, c := range []struct {
		name string
		n    int
		// life hands over action i and makes it go.
		life func(t *testing.T, p *Publisher, i int)
	}{
		{name: "created, delivered and forgotten", n: 10000, life: nil}, // see below
		{name: "forgotten before delivery", n: 200, life: func(t *testing.T, p *Publisher, i int) {
			ta := action(fmt.Sprintf("early-%d", i), flytev1.PhaseQueued, flytev1.PhaseSucceeded)
			p.Enqueue(ta)
			p.Forget(keyOf(ta))
		}},
		{name: "forgotten unfinished", n: 200, life: func(t *testing.T, p *Publisher, i int) {
			ta := action(fmt.Sprintf("unfinished-%d", i), flytev1.PhaseQueued, flytev1.PhaseRunning)
			p.Enqueue(ta)
			p.Forget(keyOf(ta))
		}},
		{name: "re-created under its name, then forgotten", n: 200, life: func(t *testing.T, p *Publisher, i int) {
			ta := action(fmt.Sprintf("again-%d", i), flytev1.PhaseQueued, flytev1.PhaseRunning)
			p.Enqueue(ta)
			again := ta.DeepCopy()
			again.UID += "-2"
			p.Enqueue(again)
			p.Forget(keyOf(again))
		}},
		{name: "refused, released and forgotten", n: 20, life: func(t *testing.T, p *Publisher, i int) {
			ta := withLogLink(action(fmt.Sprintf("refused-%d", i), flytev1.PhaseQueued, flytev1.PhaseAborted), "not a URI")
			if !p.ReleaseWhenDelivered(deleted(ta)) {
				woken(t, p, ta.UID)
			}
			p.Forget(keyOf(ta))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := startEventsService(t)
			p := startPublisher(t, svc.client, WithMaxRefusals(2))
			if c.life != nil {
				for i := range c.n {
					c.life(t, p, i)
				}
			} else {
				createdDeliveredForgotten(t, p, c.n)
			}
			eventually.True(t, 2*time.Minute, func() bool { s, n := p.sizes(); return s == 0 && n == 0 },
				func() string { s, n := p.sizes(); return fmt.Sprintf("%d states and %d names left", s, n) })
		})
	}
}

// createdDeliveredForgotten runs n actions to their end, all at once as a busy cluster
// does, waits for their delivery, and forgets them as their deletions come.
func createdDeliveredForgotten(t *testing.T, p *Publisher, n int) {
	actions := make([]*flytev1.TaskAction, n)
	for i := range actions {
		actions[i] = action(fmt.Sprintf("done-%d", i), flytev1.PhaseQueued, flytev1.PhaseRunning)
		p.Enqueue(actions[i])
	}
	for _, ta := range actions {
		ta.Status.PhaseHistory = append(ta.Status.PhaseHistory, flytev1.PhaseTransition{Phase: flytev1.PhaseSucceeded, Attempt: 1,
			Version: 2, OccurredAt: metav1.NewMicroTime(time.Now())})
		ta.Status.Phase = flytev1.PhaseSucceeded
		p.Enqueue(ta)
	}
	eventually.True(t, 2*time.Minute, func() bool {
		for _, ta := range actions {
			if !p.Delivered(ta) {
				return false
			}
		}
		return true
	}, func() string { return "not all delivered" })
	for _, ta := range actions {
		p.Forget(keyOf(ta))
	}
}

// woken waits for the publisher to wake the reconciler for uid.
func woken(t *testing.T, p *Publisher, uid types.UID) {
	t.Helper()
	select {
	case ev := <-p.deleted:
		if ev.Object.UID != uid {
			t.Fatalf("woke %s, not %s", ev.Object.UID, uid)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s was never woken: its finalizer would stay", uid)
	}
}
