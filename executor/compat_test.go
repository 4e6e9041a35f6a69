package executor_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/metricstest"
)

// refusingReplica is an events replica that refuses every Record as one older than the
// executor refuses a value it does not know, while refusing is set, and otherwise passes
// the call to the real service.
type refusingReplica struct {
	eventsv1connect.UnimplementedEventsServiceHandler
	real     eventsv1connect.EventsServiceClient
	refusing atomic.Bool
}

func (r *refusingReplica) Record(ctx context.Context, req *connect.Request[eventsv1.RecordRequest]) (*connect.Response[eventsv1.RecordResponse], error) {
	if r.refusing.Load() {
		return nil, connect.NewError(connect.CodeInvalidArgument,
			errors.New("validation error: events[0].phase: value must be one of the defined enum values"))
	}
	return r.real.Record(ctx, req)
}

// serveH2C serves h over HTTP/2 without TLS on loopback until the test ends.
func serveH2C(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestRefusedEventsCountTowardTheEventsBacklog: finished actions whose events the events
// service refuses are held by the executor as it configures itself (eventsDelivery
// maxRefusals 0), so the collector keeps them and the events backlog counts them: past
// its bound, new actions wait, which bounds what refusals can pile up in etcd. Once the
// service takes the events, every action is delivered and the held ones start.
func TestRefusedEventsCountTowardTheEventsBacklog(t *testing.T) {
	_, eventsClient, _ := restartableEvents(t)
	replica := &refusingReplica{real: eventsClient}
	replica.refusing.Store(true)
	mux := http.NewServeMux()
	mux.Handle(eventsv1connect.NewEventsServiceHandler(replica))
	url := serveH2C(t, mux)

	ns := env.Namespace(t)
	const bound, created = 2, 5
	cfg := testConfig()
	cfg.EventsServiceURL = url
	cfg.EventsBacklog.MaxUndeliveredFinished = bound
	cfg.GC.Interval = metav1.Duration{Duration: 50 * time.Millisecond}
	cfg.GC.MaxTTL = metav1.Duration{Duration: time.Millisecond}
	reg := prometheus.NewRegistry()
	start(t, cfg, ns, runOptions{registry: reg})

	actions := createActions(t, created, func(i int) *flytev1.TaskAction {
		name := fmt.Sprintf("refused-%d", i)
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "refused", ActionName: name,
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/refused", Config: map[string]string{"duration": "0s"}},
		}
	})
	var finished, held int
	eventually.True(t, time.Minute, func() bool {
		finished, held, _ = stored(t, ns)
		return finished == bound && held == created-bound &&
			metricstest.Has(t, reg, append(backlogMetrics(created-bound, bound, bound),
				fmt.Sprintf("flyte_executor_events_refused_actions %d", bound),
				fmt.Sprintf("flyte_executor_gc_kept_undelivered_actions %d", bound))...)
	}, func() string {
		return fmt.Sprintf("want %d finished, kept by the collector with their events held, and %d held by the backlog; have %d finished, %d held",
			bound, created-bound, finished, held)
	})

	// Past the 5 refusals after which events were once given up on, the actions are
	// still held, kept and counted.
	const pastTheOldLimit = bound * 6
	eventually.True(t, 2*time.Minute, func() bool {
		samples, err := metricstest.Samples(reg)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range samples {
			if s.Metric["__name__"] == "flyte_executor_events_refusals_total" && s.Metric["code"] == "invalid_argument" {
				return s.Value >= pastTheOldLimit
			}
		}
		return false
	}, func() string { return fmt.Sprintf("fewer than %d refusals counted", pastTheOldLimit) })
	if finished, held, _ = stored(t, ns); finished != bound || held != created-bound ||
		!metricstest.Has(t, reg, append(backlogMetrics(created-bound, bound, bound), fmt.Sprintf("flyte_executor_events_refused_actions %d", bound))...) {
		t.Fatalf("after %d refusals: %d finished and %d held; want %d and %d, the refused ones held and counted",
			pastTheOldLimit, finished, held, bound, created-bound)
	}

	replica.refusing.Store(false)
	// Once delivered, each is collected at once (gc.maxTTL 1ms): the events service is
	// where they are looked for.
	for _, ta := range actions {
		eventually.True(t, 2*time.Minute, func() bool {
			evs := listEvents(t, eventsClient, ta)
			return len(evs) > 0 && evs[len(evs)-1].GetPhase() == flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED
		}, func() string { return ta.Name + " never had its Succeeded event delivered" })
	}
	eventually.True(t, time.Minute, func() bool {
		return metricstest.Has(t, reg, "flyte_executor_events_refused_actions 0")
	}, func() string { return "flyte_executor_events_refused_actions did not drain to 0" })
}
