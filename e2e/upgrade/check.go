package upgrade

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/events/store"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/eventsink"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/test/systemtest"
)

// cloudEventID is the id the events service gives an event's CloudEvent (docs/events.md).
func cloudEventID(id *flytecorev1.ActionIdentifier, k systemtest.EventKey) string {
	return fmt.Sprintf("%s/%s/%s/%s/%d/%s/%d", id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction(), k.Attempt, strings.ToLower(systemtest.PhaseName(k.Phase)), k.Version)
}

// checker holds the upgraded system to its promises once the work has settled. It reads
// the events service as its clients do, through the service's address.
type checker struct {
	s      *system
	plans  []*plan
	probe  *probe
	w      *watcher
	events eventsv1connect.EventsServiceClient
	cache  cachev1connect.CacheServiceClient

	// figures of the last check
	actions, storedEvents, published int
	resent                           int                                 // events the sink took twice
	podsRun                          map[string]int                      // runtime -> pods whose container ran to its end
	cacheStatus                      map[int]map[flytev1.CacheStatus]int // group -> status -> actions
}

func newChecker(s *system, plans []*plan, pr *probe, w *watcher) (*checker, error) {
	viewer, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ViewerTokenFile, Timeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	executor, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ExecutorTokenFile, Timeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	return &checker{s: s, plans: plans, probe: pr, w: w,
		events: eventsv1connect.NewEventsServiceClient(viewer, s.events.url()),
		cache:  cachev1connect.NewCacheServiceClient(executor, s.cache.url())}, nil
}

// settle checks until every check passes or the time is up, and returns what is still
// broken: a system that recovers is given the time to deliver what it owes. What the
// upgrade cost as it went (the probe's failures, the programs' exits) is checked once.
func (ch *checker) settle(ctx context.Context, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		problems := ch.check(ctx)
		if len(problems) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			_, over := ch.probe.report()
			for _, r := range over {
				problems = append(problems, "probe: "+r.describe(ch.s.logs))
			}
			ch.probe.mu.Lock()
			for _, c := range ch.probe.inconsistent {
				problems = append(problems, "cache: "+c)
			}
			ch.probe.mu.Unlock()
			for _, p := range ch.s.all {
				if errs := logLevels(p.Log)[levelErrorNotConflict]; strings.HasPrefix(p.Name, "executor-") && errs > 0 {
					problems = append(problems, fmt.Sprintf("%s logged %d errors (other than conflicts and writes cut short by its stop); see %s", p.Name, errs, p.Log))
				}
				for _, e := range p.ExitLog() {
					if !e.Expected {
						problems = append(problems, fmt.Sprintf("%s exited at %s without the test stopping it (%s; it logged %s); see %s",
							p.Name, e.At.Format(time.TimeOnly), e.Err, lastError(p.Log, e.At), p.Log))
					}
				}
			}
			if ch.s.node != nil {
				problems = append(problems, ch.s.node.Exited()...)
			}
			sort.Strings(problems)
			return problems
		}
		sleep(ctx, 2*time.Second)
	}
}

// check runs every check once and returns the problems, each naming its action.
func (ch *checker) check(ctx context.Context) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	var list flytev1.TaskActionList
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := ch.s.client.List(lctx, &list, client.InNamespace(namespace))
	cancel()
	if err != nil {
		return []string{"listing the TaskActions: " + err.Error()}
	}
	byName := map[string]*flytev1.TaskAction{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	want := map[string]flytev1.Phase{}
	for _, p := range ch.plans {
		want[p.name] = p.expect
	}
	for _, name := range ch.probe.createdActions() {
		want[name] = flytev1.PhaseSucceeded
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	ch.actions = len(names)
	for _, name := range names {
		ta := byName[name]
		if ta == nil {
			add("%s: gone, though nothing deletes it (gc.maxTTL 1h)", name)
			continue
		}
		if ta.Status.Phase != want[name] {
			add("%s: %s, want %s (reason %s)", name, systemtest.PhaseOrNone(string(ta.Status.Phase)), want[name], systemtest.ProgressingReason(ta))
		}
		end := ch.checkEvents(ctx, ta, add)
		if store.IsTerminal(end) && !ch.w.sawPhase(idOf(ta), end) {
			add("%s: the watcher never saw it %s", name, systemtest.PhaseName(end))
		}
	}
	ch.checkPublished(ctx, add)
	ch.checkCache(ctx, add)
	ch.checkPods(ctx, add)
	sort.Strings(problems)
	return problems
}

// checkPods counts the pods whose container a runtime ran to its end (a container ID and
// an exit code), by runtime: containerd's on a real node, none ("") on the stand-in. On a
// real node each container action ran its attempts there: the flaky one two, the others
// one.
func (ch *checker) checkPods(ctx context.Context, add func(string, ...any)) {
	var list corev1.PodList
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := ch.s.client.List(lctx, &list, client.InNamespace(namespace))
	cancel()
	if err != nil {
		add("listing the pods: %v", err)
		return
	}
	ch.podsRun = map[string]int{}
	onContainerd := map[string]int{} // action -> pods
	for _, p := range list.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Terminated == nil {
				continue
			}
			runtime, _, _ := strings.Cut(c.ContainerID, "://")
			ch.podsRun[runtime]++
			if runtime == "containerd" {
				onContainerd[p.Labels[core.LabelTaskAction]]++
			}
		}
	}
	if ch.s.node == nil {
		return
	}
	for _, p := range ch.plans {
		if p.action.Spec.Container == nil {
			continue
		}
		want := 1
		if p.kind == kindContainerFlaky {
			want = 2
		}
		if onContainerd[p.name] != want {
			add("%s: %d of its pods ran to their end on the real node's containerd, want %d", p.name, onContainerd[p.name], want)
		}
	}
}

// checkEvents holds the events service to what the executors wrote: its latest state is
// the action's phase, and it holds every entry of the action's history exactly once and
// nothing else. It returns the service's latest phase.
func (ch *checker) checkEvents(ctx context.Context, ta *flytev1.TaskAction, add func(string, ...any)) flytecorev1.ActionPhase {
	id := idOf(ta)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	got, err := ch.events.GetAction(cctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
	cancel()
	if err != nil {
		add("%s: GetAction: %v", ta.Name, err)
		return flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED
	}
	state := got.Msg.GetAction().GetPhase()
	if state != eventsink.ProtoPhase(ta.Status.Phase) {
		add("%s: the events service says %s, the action %s", ta.Name, systemtest.PhaseName(state), ta.Status.Phase)
	}
	events, err := systemtest.ListActionEvents(ctx, ch.events, id)
	if err != nil {
		add("%s: ListActionEvents: %v", ta.Name, err)
		return state
	}
	systemtest.CheckHistoryStored(ta.Name, ta.Status.PhaseHistory, events, nil, add)
	return state
}

// relayBatch is the most outbox entries a relay publishes at once (events/relay's
// default Batch): what a leader stopped mid-publish can leave to the next to send again.
const relayBatch = 500

// checkPublished holds the CloudEvents egress to publishing every event the events
// service stores, once: the workload's, the probe's actions' and the probe's own records.
func (ch *checker) checkPublished(ctx context.Context, add func(string, ...any)) {
	actions, err := systemtest.ListActions(ctx, ch.events, project, domain)
	if err != nil {
		add("ListActions: %v", err)
		return
	}
	stored := map[string]bool{}
	var resent []string
	for _, a := range actions {
		id := a.GetId()
		stored[actionKey(id)] = true
		var keys []systemtest.EventKey
		if id.GetRun() == recordRun {
			// The probe records one event per action, and nothing else writes there.
			keys = []systemtest.EventKey{{Attempt: 1, Phase: flytecorev1.ActionPhase_ACTION_PHASE_QUEUED}}
		} else {
			events, err := systemtest.ListActionEvents(ctx, ch.events, id)
			if err != nil {
				add("%s: ListActionEvents: %v", actionKey(id), err)
				continue
			}
			for _, e := range events {
				keys = append(keys, systemtest.KeyOfEvent(e))
			}
		}
		for _, k := range keys {
			ceID := cloudEventID(id, k)
			switch n := ch.s.sink.times(ceID); {
			case n == 0:
				add("cloudevents: %s is stored but was never published to the sink", ceID)
			case n > 2:
				add("cloudevents: %s was published %d times", ceID, n)
			case n == 2:
				resent = append(resent, ceID)
			}
		}
	}
	ch.probe.mu.Lock()
	recorded := append([]*flytecorev1.ActionIdentifier(nil), ch.probe.recorded...)
	ch.probe.mu.Unlock()
	for _, id := range recorded {
		if !stored[actionKey(id)] {
			add("%s: the events service acknowledged its Record, but does not hold it", actionKey(id))
		}
	}
	// Publishing is at least once (docs/events.md): a relay leader stopped while a publish
	// was under way leaves it to the next leader, which sends those events again, with
	// the same id. At most a batch a handover, once each.
	ch.resent = len(resent)
	if limit := ch.s.events.stopped * relayBatch; len(resent) > limit {
		add("cloudevents: %d events published twice (first %s), more than the %d that %d handovers of the relay may resend", len(resent), resent[0], limit, ch.s.events.stopped)
	}
	ch.storedEvents = len(stored)
	ch.published, _ = ch.s.sink.counts()
}

// checkCache holds each cache group to one entry, made by one of its actions, whose
// outputs are where the entry says; and says what the cache did for each action.
func (ch *checker) checkCache(ctx context.Context, add func(string, ...any)) {
	ch.cacheStatus = map[int]map[flytev1.CacheStatus]int{}
	checked := map[int]bool{}
	members := map[int]map[string]bool{}
	for _, p := range ch.plans {
		if p.kind == kindCachedSleep {
			if members[p.group] == nil {
				members[p.group] = map[string]bool{}
			}
			members[p.group][p.name] = true
		}
	}
	for _, p := range ch.plans {
		if p.kind != kindCachedSleep {
			continue
		}
		var ta flytev1.TaskAction
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := ch.s.client.Get(cctx, client.ObjectKey{Namespace: namespace, Name: p.name}, &ta)
		cancel()
		if err == nil {
			if ch.cacheStatus[p.group] == nil {
				ch.cacheStatus[p.group] = map[flytev1.CacheStatus]int{}
			}
			if last, ok := ta.Status.PhaseHistory.Last(); ok {
				ch.cacheStatus[p.group][last.CacheStatus]++
			}
		}
		if checked[p.group] {
			continue
		}
		checked[p.group] = true
		spec := p.action.Spec
		inputs, err := os.ReadFile(strings.TrimPrefix(spec.InputURI, "file://"))
		if err != nil {
			add("cache group %d: %v", p.group, err)
			continue
		}
		hash, err := cacheclient.InputsHash(inputs, nil)
		if err != nil {
			add("cache group %d: %v", p.group, err)
			continue
		}
		key := &cachev1.CacheKey{Project: spec.Project, Domain: spec.Domain, TaskName: spec.TaskName, CacheVersion: spec.Cache.Version,
			Signature: cacheclient.Signature(&spec), InputsHash: hash}
		cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		got, err := ch.cache.Get(cctx, connect.NewRequest(&cachev1.GetRequest{Key: key}))
		cancel()
		if err != nil {
			add("cache group %d: Get of its key: %v", p.group, err)
			continue
		}
		out := got.Msg.GetOutput()
		if src := out.GetSourceAction().GetAction(); !members[p.group][src] {
			add("cache group %d: its entry was made by %q, not by one of its actions", p.group, src)
		}
		// A sleep has no outputs: its entry names none.
		if uri := out.GetOutputUri(); uri == "" {
			continue
		}
		if _, err := os.Stat(strings.TrimPrefix(out.GetOutputUri(), "file://")); err != nil {
			add("cache group %d: its entry's outputs %s: %v", p.group, out.GetOutputUri(), err)
		}
	}
}

// figures say what the last check saw.
func (ch *checker) figures() []string {
	events, requests := ch.s.sink.counts()
	out := []string{
		fmt.Sprintf("%d actions checked (%d planned, the rest created by the probe); %d actions stored in the events service", ch.actions, len(ch.plans), ch.storedEvents),
		fmt.Sprintf("the sink took %d distinct CloudEvents in %d requests, %d of them twice (resent by the next relay leader); the watcher opened %d streams", events, requests, ch.resent, ch.w.streamCount()),
	}
	runtimes := make([]string, 0, len(ch.podsRun))
	for rt, n := range ch.podsRun {
		runtimes = append(runtimes, fmt.Sprintf("%d on %s", n, cmp.Or(rt, "the stand-in kubelet")))
	}
	sort.Strings(runtimes)
	out = append(out, "pods run to their end: "+cmp.Or(strings.Join(runtimes, ", "), "none"))
	for _, p := range ch.s.all {
		levels := logLevels(p.Log)
		out = append(out, fmt.Sprintf("%s logged %d errors (%d of them conflicts or cut short by its stop) and %d warnings", p.Name, levels["ERROR"],
			levels["ERROR"]-levels[levelErrorNotConflict], levels["WARN"]))
	}
	for _, p := range ch.s.all {
		if f := clusterKeyPasses(p.Log); f != "" {
			out = append(out, p.Name+" "+f)
		}
	}
	groups := make([]int, 0, len(ch.cacheStatus))
	for g := range ch.cacheStatus {
		groups = append(groups, g)
	}
	sort.Ints(groups)
	for _, g := range groups {
		var parts []string
		for st, n := range ch.cacheStatus[g] {
			parts = append(parts, fmt.Sprintf("%s %d", systemtest.PhaseOrNone(string(st)), n))
		}
		sort.Strings(parts)
		out = append(out, fmt.Sprintf("cache group %d: %s", g, strings.Join(parts, ", ")))
	}
	return out
}

func idOf(ta *flytev1.TaskAction) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName}
}

// refPattern finds the reference an internal error names; the service logs the error
// under it.
var refPattern = regexp.MustCompile(`under ref ([0-9a-f]{32})`)

// explain finds what the service logged under the reference an internal error shows
// its caller, so that a failure says its cause: " (logged by events-v0.1.0: ...)".
func explain(logs, msg string) string {
	m := refPattern.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	files, _ := filepath.Glob(filepath.Join(logs, "*.log"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if !strings.Contains(line, m[1]) {
				continue
			}
			var entry struct {
				Error string `json:"error"`
			}
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Error != "" {
				return fmt.Sprintf(" (logged by %s: %s)", strings.TrimSuffix(filepath.Base(f), ".log"), entry.Error)
			}
		}
	}
	return ""
}

// levelErrorNotConflict counts the errors of a log but for a status write refused as a
// conflict (the object changed since the executor read it), which controller-runtime
// logs as an error and retries at once (seen in a rolling restart of the tree itself,
// before any upgrade step, and no loss), and for a write cut short by the stop the test
// asked for ("context canceled": the executor is ending, and its successor writes again;
// or the Lease's release reported by controller-runtime once its stop had begun, "error
// received after stop sequence was engaged").
const levelErrorNotConflict = "ERROR but conflict"

// logLevels counts the lines of a program's JSON log by level.
func logLevels(path string) map[string]int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(raw), "\n") {
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Err   string `json:"err"`
		}
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &entry) == nil {
			level := strings.ToUpper(entry.Level)
			out[level]++
			if level == "ERROR" && !strings.Contains(entry.Err, "the object has been modified") && !strings.Contains(entry.Err, "context canceled") &&
				entry.Msg != "error received after stop sequence was engaged" {
				out[levelErrorNotConflict]++
			}
		}
	}
	return out
}

// clusterKeyPasses sums what an events replica logged of its passes completing the keys
// with the cluster (events.completeClusterKeys), "" when it logged none: a release's
// background work that its successor's contract migration needs done.
func clusterKeyPasses(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var passes, keyed, backfilled int
	var seconds float64
	done := false
	for _, line := range strings.Split(string(raw), "\n") {
		var entry struct {
			Msg        string   `json:"msg"`
			Partitions []string `json:"partitions"`
			Backfilled int      `json:"backfilled"`
			Done       bool     `json:"done"`
			Seconds    float64  `json:"seconds"`
		}
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &entry) != nil || entry.Msg != "completed keys with the cluster" {
			continue
		}
		passes++
		keyed += len(entry.Partitions)
		backfilled += entry.Backfilled
		seconds += entry.Seconds
		done = entry.Done
	}
	if passes == 0 {
		return ""
	}
	return fmt.Sprintf("keyed %d partitions with the cluster and gave %d actions theirs in %d passes of %.1f s in all (done: %t)", keyed, backfilled, passes, seconds, done)
}
