package controller_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
)

// TestOneNamespacesBacklogDoesNotHoldUpAnother: a backlog of one namespace, created while
// the executor runs, and then actions of another: those finish while most of the
// backlog still waits. With controller-runtime's queue, first in, first out across
// namespaces, they finished behind the whole backlog.
func TestOneNamespacesBacklogDoesNotHoldUpAnother(t *testing.T) {
	ctx := context.Background()
	batch, interactive := env.Namespace(t), env.Namespace(t)
	// 25 ms a pass on 4 workers: the backlog drains at most at 160 passes a second,
	// far slower than it is created.
	slowNamespaces.Store(batch, 25*time.Millisecond)
	defer slowNamespaces.Delete(batch)

	const backlog = 120
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < backlog; i += 8 {
				create(t, newAction(batch, fmt.Sprintf("batch-%d", i), "test-echo", nil))
			}
		})
	}
	wg.Wait()
	var waiting []*flytev1.TaskAction
	for i := range 3 {
		ta := newAction(interactive, fmt.Sprintf("interactive-%d", i), "test-echo", nil)
		create(t, ta)
		waiting = append(waiting, ta)
	}
	for _, ta := range waiting {
		waitFor(t, ta, "finished", terminal)
	}
	unfinished := func() int {
		var list flytev1.TaskActionList
		if err := env.Client.List(ctx, &list, client.InNamespace(batch)); err != nil {
			t.Fatal(err)
		}
		n := backlog - len(list.Items)
		for i := range list.Items {
			if !terminal(&list.Items[i]) {
				n++
			}
		}
		return n
	}
	if n := unfinished(); n < backlog/2 {
		t.Errorf("the other namespace's actions finished with only %d of the backlog's %d unfinished; want them served in turn, not behind it", n, backlog)
	}
	// Leave an idle executor to the next test.
	eventually.True(t, time.Minute, func() bool { return unfinished() == 0 },
		func() string { return fmt.Sprintf("%d of the backlog unfinished", unfinished()) })
}
