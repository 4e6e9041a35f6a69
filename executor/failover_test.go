package executor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
)

// TestANewLeaderServesOlderActionsThroughABurst: after a failover, the new leader's
// first list puts the actions that were there at a low priority, and each requeue keeps
// it. A burst of new actions in another namespace, faster than the executor reconciles,
// must not leave them without passes until the burst is over: an older action that
// waited behind it long enough is promoted, and finishes while the burst still waits.
func TestANewLeaderServesOlderActionsThroughABurst(t *testing.T) {
	ctx := context.Background()
	quiet, burst := env.Namespace(t), env.Namespace(t)
	cfg := testConfig()
	cfg.MaxConcurrentReconciles = 2
	action := func(ns, name, duration string) *flytev1.TaskAction {
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "failover", ActionName: name,
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/failover", Config: map[string]string{"duration": duration}},
		}
	}

	// The first leader starts an action that is due again, its sleep over, after it stops.
	stopFirst, _ := start(t, cfg, quiet, runOptions{alsoNamespaces: []string{burst}})
	old := action(quiet, "old", "1s")
	if err := env.Client.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, client.ObjectKeyFromObject(old), flytev1.PhaseRunning)
	stopFirst()

	// A burst in the other namespace, created faster than the next leader, at 100 ms a
	// pass there on 2 workers, reconciles it: until the old action finishes, or at most
	// a backlog that takes that leader tens of seconds.
	const most = 300
	var created atomic.Int64
	oldDone := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range most {
			select {
			case <-oldDone:
				return
			default:
			}
			if err := env.Client.Create(ctx, action(burst, fmt.Sprintf("burst-%d", i), "0s")); err != nil {
				t.Error(err)
				return
			}
			created.Add(1)
		}
	})
	defer wg.Wait()
	eventually.True(t, time.Minute, func() bool { return created.Load() >= 20 },
		func() string { return "the burst did not start" })
	slow := func(req ctrl.Request) {
		if req.Namespace == burst {
			time.Sleep(100 * time.Millisecond) // a worker busy that long, as on a loaded cluster
		}
	}
	start(t, cfg, quiet, runOptions{alsoNamespaces: []string{burst}, observe: slow, promoteAfter: time.Second})

	unfinished := func() int {
		var list flytev1.TaskActionList
		if err := env.Client.List(ctx, &list, client.InNamespace(burst)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ta := range list.Items {
			if !ta.Status.Phase.IsTerminal() {
				n++
			}
		}
		return n
	}
	waitSucceeded(t, client.ObjectKeyFromObject(old))
	close(oldDone)
	wg.Wait()
	// Promoted after a second, it is served within seconds: at 100 ms a pass on 2
	// workers, a few dozen of the burst finish meanwhile. Behind the burst it would
	// have waited for nearly all of it.
	done := int(created.Load()) - unfinished()
	t.Logf("the old action finished after %d of the burst's %d actions", done, created.Load())
	if done >= most/3 {
		t.Errorf("the old action finished after %d of the burst's %d actions; want it served while the burst waits, not after it",
			done, created.Load())
	}
	// Leave an idle executor to the next test.
	eventually.True(t, 2*time.Minute, func() bool { return unfinished() == 0 },
		func() string { return fmt.Sprintf("%d of the burst unfinished", unfinished()) })
}
