package executor_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/eventsink"
	"github.com/flytekube/backend/internal/eventually"
	"github.com/flytekube/backend/internal/pgtest"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/internal/servicetest"
	"github.com/flytekube/backend/services/auth"
)

// TestNewLeaderDeliversWhatItsPredecessorWrote: an executor that stops (a leader change,
// a crash) may leave history written to an action but not yet delivered. Its successor
// delivers it at its first pass over the action, not at the action's next change of
// phase, which for a task running for hours is hours away: until then the events
// service, the console and every watcher would show the action as Queued.
func TestNewLeaderDeliversWhatItsPredecessorWrote(t *testing.T) {
	pg := pgtest.New(t)
	db := pg.NewDatabase(t)
	startEvents := func(listen string) *servicetest.Instance {
		return servicetest.Run(t, events.Run, events.Config{Listen: listen, DatabaseURL: db, Auth: auth.Config{Mode: auth.ModeNone}})
	}
	svc := startEvents("127.0.0.1:0")
	eventsClient, err := eventsink.NewClient(svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(svc.URL, "http://")
	svc.Stop() // the first executor's deliveries all fail

	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.EventsServiceURL = svc.URL
	var count atomic.Int64
	stopFirst := run(t, cfg, ns, &count)
	actions := createActions(t, 3, func(i int) *flytev1.TaskAction {
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("long-%d", i), Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "handover", ActionName: fmt.Sprintf("long-%d", i),
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/handover", Config: map[string]string{"duration": "1h"}},
		}
	})
	for _, ta := range actions {
		eventually.True(t, time.Minute, func() bool {
			var got flytev1.TaskAction
			return env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got) == nil && got.Status.Phase == flytev1.PhaseRunning
		}, func() string { return ta.Name + " never ran" })
	}
	stopFirst()

	startEvents(addr)
	run(t, cfg, ns, &count)
	for _, ta := range actions {
		var got flytev1.TaskAction
		stored := 0
		eventually.True(t, 30*time.Second, func() bool {
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(ta), &got); err != nil {
				return false
			}
			stored = len(listEvents(t, eventsClient, ta))
			return stored == len(got.Status.PhaseHistory)
		}, func() string {
			return fmt.Sprintf("%s: %d of its %d history entries delivered by the new executor", ta.Name, stored, len(got.Status.PhaseHistory))
		})
		if got.Status.Phase != flytev1.PhaseRunning {
			t.Fatalf("%s is %s; want it still running", ta.Name, got.Status.Phase)
		}
	}
}
