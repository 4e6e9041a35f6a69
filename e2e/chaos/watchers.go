package chaos

import (
	"context"
	"fmt"
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

// watchers hold a WatchActions stream open on each events replica, for each tenant's
// project, as a console would: a stream that ends (its replica killed, the server
// ending it) is opened again and, once the server has subscribed it, followed by a new
// listing, as the service asks of its clients. Every finish must reach every watcher:
// an update lost between one replica's commit and another's watchers shows as a watcher
// that never sees an action's end.
type watchers struct {
	mu sync.Mutex
	// seen are the phases each watcher saw of each action, by watcher, then by
	// project/domain/run/action.
	seen map[string]map[string]map[flytecorev1.ActionPhase]bool
	// streams counts the streams each watcher opened.
	streams map[string]int
}

func newWatchers() *watchers {
	return &watchers{seen: map[string]map[string]map[flytecorev1.ActionPhase]bool{}, streams: map[string]int{}}
}

// watcherName names the watcher of replica on project.
func watcherName(replica, project string) string { return replica + " (project " + project + ")" }

// follow watches project on one replica until ctx ends.
func (ws *watchers) follow(ctx context.Context, hc *http.Client, replica, url, project string) {
	c := eventsv1connect.NewEventsServiceClient(hc, url)
	name := watcherName(replica, project)
	ws.mu.Lock()
	ws.seen[name] = map[string]map[flytecorev1.ActionPhase]bool{}
	ws.mu.Unlock()
	for ctx.Err() == nil {
		stream, err := c.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: project, Domain: "development"}))
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		// The headers come once the server has subscribed the stream: a listing taken
		// after them misses nothing the stream would not bring.
		_ = stream.ResponseHeader()
		ws.mu.Lock()
		ws.streams[name]++
		ws.mu.Unlock()
		actions, err := systemtest.ListActions(ctx, c, project, "development")
		if err != nil {
			_ = stream.Close()
			sleep(ctx, time.Second)
			continue
		}
		for _, a := range actions {
			ws.saw(name, a)
		}
		for stream.Receive() {
			ws.saw(name, stream.Msg().GetAction())
		}
		_ = stream.Close()
		sleep(ctx, 200*time.Millisecond)
	}
}

func (ws *watchers) saw(watcher string, a *eventsv1.Action) {
	if a == nil {
		return
	}
	key := actionKey(a.GetId())
	ws.mu.Lock()
	defer ws.mu.Unlock()
	phases := ws.seen[watcher][key]
	if phases == nil {
		phases = map[flytecorev1.ActionPhase]bool{}
		ws.seen[watcher][key] = phases
	}
	phases[a.GetPhase()] = true
}

func actionKey(id *flytecorev1.ActionIdentifier) string {
	return strings.Join([]string{id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction()}, "/")
}

// missed says which watchers of project never saw the action end in phase end.
func (ws *watchers) missed(id *flytecorev1.ActionIdentifier, end flytecorev1.ActionPhase) []string {
	key := actionKey(id)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []string
	for watcher, seen := range ws.seen {
		if !strings.HasSuffix(watcher, "(project "+id.GetProject()+")") {
			continue
		}
		if !seen[key][end] {
			var got []string
			for ph := range seen[key] {
				got = append(got, systemtest.PhaseName(ph))
			}
			out = append(out, fmt.Sprintf("%s saw %s", watcher, systemtest.PhaseOrNone(strings.Join(got, " "))))
		}
	}
	return out
}
