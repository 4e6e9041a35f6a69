package eventsink

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/flytekube/backend/events"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

// action is a TaskAction whose history holds phases, one entry each, in attempt 1.
func action(uid string, phases ...flytev1.Phase) *flytev1.TaskAction {
	ta := &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "demo", UID: types.UID(uid)},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "run", ActionName: uid,
			TaskName: "demo.sleep", TaskType: "core-sleep"},
	}
	at := time.Now().Add(-time.Minute)
	for i, ph := range phases {
		ta.Status.PhaseHistory = append(ta.Status.PhaseHistory, flytev1.PhaseTransition{
			Phase: ph, Attempt: 1, Version: int32(i), OccurredAt: metav1.NewMicroTime(at.Add(time.Duration(i) * time.Second)),
		})
		ta.Status.Phase = ph
	}
	ta.Status.Attempts = 1
	return ta
}

// deleted is ta as the reconciler sees it once it is deleted.
func deleted(ta *flytev1.TaskAction) *flytev1.TaskAction {
	ta = ta.DeepCopy()
	now := metav1.Now()
	ta.DeletionTimestamp = &now
	return ta
}

// A deleted action keeps its finalizer until its history is delivered, and the
// publisher must wake the reconciler then, whatever snapshot it was delivering: the
// reconciler waits for nothing else (no resync comes soon).
func TestADeletedActionIsWokenOnceItsHistoryIsDelivered(t *testing.T) {
	for _, c := range []struct {
		name string
		// handed over before the deletion, by the reconciler's earlier passes
		before *flytev1.TaskAction
		// as the deleting pass finds it
		atDeletion *flytev1.TaskAction
	}{
		{
			// The pass that wrote the outcome failed to take the finalizer off; then the
			// action was deleted while its outcome was still on its way.
			name:       "finished, then deleted before its outcome was delivered",
			before:     action("finished", flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseSucceeded),
			atDeletion: deleted(action("finished", flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseSucceeded)),
		},
		{
			// Deleted while it ran: the deleting pass records Aborted.
			name:       "aborted by its deletion",
			before:     action("aborted", flytev1.PhaseQueued, flytev1.PhaseRunning),
			atDeletion: deleted(action("aborted", flytev1.PhaseQueued, flytev1.PhaseRunning, flytev1.PhaseAborted)),
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The events service is down until the deletion has been handled.
			db := pg.NewDatabase(t)
			start := func(listen string) *servicetest.Instance {
				return servicetest.Run(t, events.Run, events.Config{Listen: listen, DatabaseURL: db, Auth: auth.Config{Mode: auth.ModeNone}})
			}
			svc := start("127.0.0.1:0")
			svc.Stop()
			client, err := NewClient(svc.URL, rpcclient.Options{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			p := New(client, "test", clock.RealClock{}, slog.New(slog.DiscardHandler))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = p.Start(ctx) }()

			p.Enqueue(c.before)
			if p.ReleaseWhenDelivered(c.atDeletion) {
				t.Fatal("delivered with the events service down")
			}
			start(strings.TrimPrefix(svc.URL, "http://"))
			select {
			case ev := <-p.deleted:
				if ev.Object.Name != c.atDeletion.Name || ev.Object.DeletionTimestamp.IsZero() {
					t.Errorf("woke for %s (deleted: %v)", ev.Object.Name, !ev.Object.DeletionTimestamp.IsZero())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the reconciler was never woken: the finalizer would stay")
			}
			if !p.ReleaseWhenDelivered(c.atDeletion) {
				t.Error("woken, but the history is not delivered")
			}
		})
	}
}
