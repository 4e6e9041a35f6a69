package upgrade

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/test/systemtest"
)

// watcher holds a WatchActions stream open on the events service's address through the
// whole upgrade, as a console would: a stream that ends (its replica stopped) is opened
// again and, once the server has subscribed it, followed by a listing, as the service
// asks of its clients (the soak's watchers do the same, on each replica).
type watcher struct {
	mu      sync.Mutex
	seen    map[string]map[flytecorev1.ActionPhase]bool // project/domain/run/action -> phases
	streams int
}

func newWatcher() *watcher {
	return &watcher{seen: map[string]map[flytecorev1.ActionPhase]bool{}}
}

// follow watches project until ctx ends.
func (w *watcher) follow(ctx context.Context, hc *http.Client, url, project string) {
	c := eventsv1connect.NewEventsServiceClient(hc, url)
	for ctx.Err() == nil {
		stream, err := c.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: project, Domain: domain}))
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		// The headers come once the server has subscribed the stream: a listing taken
		// after them misses nothing the stream would not bring.
		_ = stream.ResponseHeader()
		w.mu.Lock()
		w.streams++
		w.mu.Unlock()
		actions, err := systemtest.ListActions(ctx, c, project, domain)
		if err != nil {
			_ = stream.Close()
			sleep(ctx, time.Second)
			continue
		}
		for _, a := range actions {
			w.saw(a)
		}
		for stream.Receive() {
			w.saw(stream.Msg().GetAction())
		}
		_ = stream.Close()
		sleep(ctx, 200*time.Millisecond)
	}
}

func (w *watcher) saw(a *eventsv1.Action) {
	if a == nil {
		return
	}
	key := actionKey(a.GetId())
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen[key] == nil {
		w.seen[key] = map[flytecorev1.ActionPhase]bool{}
	}
	w.seen[key][a.GetPhase()] = true
}

// sawPhase says whether the watcher saw the action in phase ph.
func (w *watcher) sawPhase(id *flytecorev1.ActionIdentifier, ph flytecorev1.ActionPhase) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[actionKey(id)][ph]
}

func (w *watcher) streamCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.streams
}

func actionKey(id *flytecorev1.ActionIdentifier) string {
	return strings.Join([]string{id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction()}, "/")
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
