package executor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/metricstest"
)

// released holds the keys (config.release) whose test-until actions may finish.
var released sync.Map

// untilPlugin runs until the test releases its action's config.release key: an action
// that is running for as long as the test wants.
type untilPlugin struct{}

func (untilPlugin) GetID() string                                             { return "test-until" }
func (untilPlugin) GetProperties() core.Properties                            { return core.Properties{} }
func (untilPlugin) Abort(context.Context, core.TaskExecutionContext) error    { return nil }
func (untilPlugin) Finalize(context.Context, core.TaskExecutionContext) error { return nil }

func (untilPlugin) Handle(_ context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	if _, ok := released.Load(tCtx.Metadata().Action().Spec.Config["release"]); ok {
		return core.DoTransition(core.PhaseInfoSuccess("")), nil
	}
	info := core.PhaseInfoRunning(0, "Waiting")
	info.RequeueAfter = 50 * time.Millisecond
	return core.DoTransition(info), nil
}

func untilEntry() core.Entry {
	return core.Entry{ID: "test-until", RegisteredTaskTypes: []string{"test-until"},
		LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return untilPlugin{}, nil }}
}

// heldForBacklog reports whether ta waits for the events backlog as a held action does:
// Queued, no history, its Progressing condition saying why.
func heldForBacklog(ta *flytev1.TaskAction) bool {
	c := meta.FindStatusCondition(ta.Status.Conditions, flytev1.ConditionProgressing)
	return ta.Status.Phase == flytev1.PhaseQueued && len(ta.Status.PhaseHistory) == 0 &&
		c != nil && c.Status == metav1.ConditionTrue && c.Reason == flytev1.ReasonEventsBacklog
}

// stored counts the namespace's actions that are finished, and those held.
func stored(t *testing.T, ns string) (finished, held int, actions []flytev1.TaskAction) {
	t.Helper()
	var list flytev1.TaskActionList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		switch ta := &list.Items[i]; {
		case ta.Status.Phase.IsTerminal():
			finished++
		case heldForBacklog(ta):
			held++
		}
	}
	return finished, held, list.Items
}

// backlogMetrics are the gauges an operator watches during an events outage.
func backlogMetrics(held, undelivered, bound int) []string {
	return []string{
		fmt.Sprintf("flyte_executor_events_backlog_held_actions %d", held),
		fmt.Sprintf("flyte_executor_events_backlog_finished_undelivered_actions %d", undelivered),
		fmt.Sprintf("flyte_executor_events_backlog_max_finished_undelivered %d", bound),
	}
}

// TestEventsOutageHoldsNewActionsWithinTheBound: while the events service is away, the
// finished actions whose history waits for it stay in the API server. Past
// eventsBacklog.maxUndeliveredFinished, new actions wait (Queued, EventsBacklog, shown by
// the metrics) while running ones finish; a held action is written once, however often
// it is looked at, and can be deleted; a new executor (a failover) counts the backlog
// before it starts anything; and once the service is back, every action finishes and is
// delivered, without anyone touching them.
func TestEventsOutageHoldsNewActionsWithinTheBound(t *testing.T) {
	svc, eventsClient, restartEvents := restartableEvents(t)
	ns := env.Namespace(t)
	const bound, streamed = 5, 20
	cfg := testConfig()
	cfg.EventsServiceURL = svc.URL
	cfg.EventsBacklog.MaxUndeliveredFinished = bound
	firstMetrics := prometheus.NewRegistry()
	stopFirst, _ := start(t, cfg, ns, runOptions{plugins: []core.Entry{untilEntry()}, registry: firstMetrics})

	// Two actions run across the outage.
	action := func(name, taskType string, config map[string]string) *flytev1.TaskAction {
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "outage", ActionName: name,
				TaskName: "demo." + taskType, TaskType: taskType, RunOutputBase: "mem://out/outage", Config: config},
		}
	}
	running := createActions(t, 2, func(i int) *flytev1.TaskAction {
		return action(fmt.Sprintf("long-%d", i), "test-until", map[string]string{"release": ns + "/long"})
	})
	for _, ta := range running {
		waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)
	}

	svc.Stop()
	stream := createActions(t, streamed, func(i int) *flytev1.TaskAction {
		return action(fmt.Sprintf("new-%d", i), "core-sleep", map[string]string{"duration": "0s"})
	})
	// The first actions finish until the bound is reached; the rest wait, saying why.
	var finished, held int
	eventually.True(t, time.Minute, func() bool {
		finished, held, _ = stored(t, ns)
		return finished == bound && held == streamed-bound &&
			metricstest.Has(t, firstMetrics, backlogMetrics(streamed-bound, bound, bound)...)
	}, func() string {
		return fmt.Sprintf("want %d finished and %d held; have %d finished, %d held", bound, streamed-bound, finished, held)
	})

	// The running actions finish normally: the backlog passes the bound by them alone.
	released.Store(ns+"/long", true)
	for _, ta := range running {
		waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseSucceeded)
	}
	eventually.True(t, time.Minute, func() bool {
		return metricstest.Has(t, firstMetrics, backlogMetrics(streamed-bound, bound+2, bound)...)
	}, func() string { return "the metrics never counted the running actions' finish" })
	finished, held, actions := stored(t, ns)
	if finished != bound+2 || held != streamed-bound {
		t.Fatalf("after the running actions finished: %d finished, %d held; want %d and %d", finished, held, bound+2, streamed-bound)
	}
	heldVersions := map[string]string{}
	var heldNames []string
	for _, ta := range actions {
		if heldForBacklog(&ta) {
			heldVersions[ta.Name] = ta.ResourceVersion
			heldNames = append(heldNames, ta.Name)
			c := meta.FindStatusCondition(ta.Status.Conditions, flytev1.ConditionProgressing)
			if c.Message == "" || ta.Status.Attempts != 0 || ta.Status.StartedAt != nil || len(ta.Finalizers) != 0 {
				t.Fatalf("held action %s: condition %+v, attempts %d, startedAt %v, finalizers %v; want a message, "+
					"and nothing started or held on to", ta.Name, c, ta.Status.Attempts, ta.Status.StartedAt, ta.Finalizers)
			}
		}
	}

	// A held action can be deleted: it has nothing to abort or to report, and goes at once.
	gone := action(heldNames[0], "core-sleep", nil)
	if err := env.Client.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, time.Minute, func() bool {
		return apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKeyFromObject(gone), &flytev1.TaskAction{})) &&
			metricstest.Has(t, firstMetrics, backlogMetrics(streamed-bound-1, bound+2, bound)...)
	}, func() string { return "the held action " + gone.Name + " was not deleted, or is still counted as held" })
	delete(heldVersions, gone.Name)

	// A failover: the new executor knows nothing delivered, counts the backlog from what
	// it finds, and holds an action created now. It looks at every held action and writes
	// none of them again.
	stopFirst()
	var seen sync.Map
	secondMetrics := prometheus.NewRegistry()
	start(t, cfg, ns, runOptions{plugins: []core.Entry{untilEntry()}, registry: secondMetrics,
		observe: func(req ctrl.Request) { seen.Store(req.Name, true) }})
	late := createActions(t, 1, func(int) *flytev1.TaskAction {
		return action("late", "core-sleep", map[string]string{"duration": "0s"})
	})[0]
	stillHeld := streamed - bound - 1 + 1
	eventually.True(t, time.Minute, func() bool {
		var got flytev1.TaskAction
		if env.Client.Get(context.Background(), client.ObjectKeyFromObject(late), &got) != nil || !heldForBacklog(&got) {
			return false
		}
		for name := range heldVersions {
			if _, ok := seen.Load(name); !ok {
				return false
			}
		}
		return metricstest.Has(t, secondMetrics, backlogMetrics(stillHeld, bound+2, bound)...)
	}, func() string {
		return "the new executor did not hold the late action, look at every held one, or count the backlog"
	})
	finished, held, actions = stored(t, ns)
	if finished != bound+2 || held != stillHeld {
		t.Fatalf("after the failover: %d finished, %d held; want %d and %d", finished, held, bound+2, stillHeld)
	}
	for _, ta := range actions {
		if v, ok := heldVersions[ta.Name]; ok && ta.ResourceVersion != v {
			t.Fatalf("held action %s was written again (resourceVersion %s, then %s): a recheck must cost no write", ta.Name, v, ta.ResourceVersion)
		}
	}

	// The events service comes back: the backlog is delivered, and every action starts,
	// finishes and is delivered in turn.
	restartEvents()
	back := time.Now()
	for _, ta := range append(append(running, late), stream...) {
		if ta.Name == gone.Name {
			continue
		}
		got := waitDelivered(t, eventsClient, ta)
		// A held action's events begin with its Queued entry, which says it waited.
		if first := got.Status.PhaseHistory[0]; heldVersions[ta.Name] != "" &&
			(first.Phase != flytev1.PhaseQueued || !strings.Contains(first.Message, flytev1.ReasonEventsBacklog)) {
			t.Fatalf("held action %s began its history with %+v; want Queued, saying it waited for the events backlog", ta.Name, first)
		}
	}
	t.Logf("every action finished and delivered %s after the events service came back", time.Since(back).Round(time.Millisecond))
	eventually.True(t, time.Minute, func() bool {
		return metricstest.Has(t, secondMetrics, backlogMetrics(0, 0, bound)...)
	}, func() string { return "the backlog metrics did not drain to zero" })
	if n := len(listEvents(t, eventsClient, gone)); n != 0 {
		t.Fatalf("the deleted held action has %d events; it never started, so want none", n)
	}
}

// TestHeldActionsStartFairlyAcrossNamespaces: held actions start in turn by namespace,
// not in the order they were held, so that a namespace that created many while the
// events service was away does not hold back another's few once it is back.
func TestHeldActionsStartFairlyAcrossNamespaces(t *testing.T) {
	svc, eventsClient, restartEvents := restartableEvents(t)
	busy, quiet := env.Namespace(t), env.Namespace(t)
	cfg := testConfig()
	cfg.EventsServiceURL = svc.URL
	cfg.EventsBacklog.MaxUndeliveredFinished = 1 // one action at a time: the order shows
	cfg.Namespaces = []string{busy, quiet}
	registry := prometheus.NewRegistry()
	start(t, cfg, busy, runOptions{registry: registry})

	svc.Stop()
	sleeper := func(ns, name string) *flytev1.TaskAction {
		return &flytev1.TaskAction{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "fair-" + ns, ActionName: name,
				TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/fair", Config: map[string]string{"duration": "0s"}},
		}
	}
	// The busy namespace's actions are all held before the quiet one's.
	const many = 10
	busyActions := createActions(t, many, func(i int) *flytev1.TaskAction { return sleeper(busy, fmt.Sprintf("busy-%d", i)) })
	eventually.True(t, time.Minute, func() bool {
		return metricstest.Has(t, registry, backlogMetrics(many-1, 1, 1)...)
	}, func() string { return "the busy namespace's actions were not held" })
	quietActions := createActions(t, 2, func(i int) *flytev1.TaskAction { return sleeper(quiet, fmt.Sprintf("quiet-%d", i)) })
	eventually.True(t, time.Minute, func() bool {
		return metricstest.Has(t, registry, backlogMetrics(many+1, 1, 1)...)
	}, func() string { return "the quiet namespace's actions were not held" })

	restartEvents()
	startedAt := func(ta *flytev1.TaskAction) time.Time {
		return waitDelivered(t, eventsClient, ta).Status.PhaseHistory[0].OccurredAt.Time
	}
	var quietLast time.Time
	for _, ta := range quietActions {
		if at := startedAt(ta); at.After(quietLast) {
			quietLast = at
		}
	}
	later := 0
	for _, ta := range busyActions {
		if startedAt(ta).After(quietLast) {
			later++
		}
	}
	// In turn: busy, quiet, busy, quiet, then the rest of busy; in the order held, the
	// quiet namespace's would have started last.
	if later < many-4 {
		t.Fatalf("only %d of the busy namespace's %d actions started after the quiet namespace's two; want at least %d", later, many, many-4)
	}
}
