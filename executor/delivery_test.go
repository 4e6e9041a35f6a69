package executor_test

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/eventsink"
	"github.com/flytekube/backend/internal/rpcclient"
)

// TestOneBadEventHoldsOnlyItsAction: the events service refuses a whole batch for one bad
// event. That action's events must wait alone (kept, retried, reported), while the
// actions that shared its batch are delivered.
func TestOneBadEventHoldsOnlyItsAction(t *testing.T) {
	ctx := context.Background()
	svc := startEventsService(t)
	ns := env.Namespace(t)

	// Finished actions, written before the executor starts, so that it finds them all at
	// once and sends their events together; one has a log link the service refuses.
	finished := func(name, logLink string) *flytev1.TaskAction {
		ta := &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "batch", ActionName: name,
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/batch"},
		}
		if err := env.Client.Create(ctx, ta); err != nil {
			t.Fatal(err)
		}
		now := metav1.Now()
		ta.Status = flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, Attempts: 1, CompletedAt: &now,
			PhaseHistory: []flytev1.PhaseTransition{{Phase: flytev1.PhaseSucceeded, Attempt: 1, Reason: "Succeeded",
				OccurredAt: metav1.NewMicroTime(now.Time), LogLinks: []flytev1.LogLink{{Name: "logs", URI: logLink}}}}}
		if err := env.Client.Status().Update(ctx, ta); err != nil {
			t.Fatal(err)
		}
		return ta
	}
	var good []*flytev1.TaskAction
	for i := range 10 {
		good = append(good, finished(fmt.Sprintf("good-%d", i), "https://logs.example.com/"+fmt.Sprint(i)))
	}
	bad := finished("bad", "not a URI")

	cfg := testConfig()
	cfg.EventsServiceURL = svc.URL
	run(t, cfg, ns, nil)
	eventsClient, err := eventsink.NewClient(svc.URL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ta := range good {
		waitDelivered(t, eventsClient, ta)
	}
	if n := len(listEvents(t, eventsClient, bad)); n != 0 {
		t.Fatalf("the events service stored %d of the refused action's events", n)
	}
}
