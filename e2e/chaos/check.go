package chaos

import (
	"context"
	"fmt"
	"sort"
	"time"

	"connectrpc.com/connect"

	eventstore "github.com/flytekube/backend/events/store"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/eventsink"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/test/systemtest"
)

// checker holds the system to its promises once the chaos is over.
type checker struct {
	s   *system
	w   *workload
	obs *observer
	f   *faults
	sm  *sampler
	ws  *watchers
	// tightest is the action that came closest to its fault-cost bound, and how close.
	tightest      string
	tightestRatio float64
}

// settle checks until every check passes or the time is up, and returns what is still
// broken: a system that recovers is given the time to deliver what it owes.
func (ch *checker) settle(ctx context.Context, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		problems := ch.check(ctx)
		if len(problems) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			// What the run saw as it went (the bound on stored actions, memory, what
			// each fault cost) no settling changes: checked once, at the end.
			problems = append(problems, ch.sm.boundProblems()...)
			problems = append(problems, ch.sm.memoryProblems()...)
			problems = append(problems, ch.costProblems()...)
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

	ch.w.mu.Lock()
	created := make(map[string]bool, len(ch.w.created))
	for k, v := range ch.w.created {
		created[k] = v
	}
	deleted := make(map[string]time.Time, len(ch.w.deleted))
	for k, v := range ch.w.deleted {
		deleted[k] = v
	}
	problems = append(problems, ch.w.errs...)
	ch.w.mu.Unlock()

	for _, p := range ch.w.plans {
		if !created[p.name] {
			continue
		}
		_, wasDeleted := deleted[p.name]
		r, seen := ch.obs.record(p.name)
		if !seen || r.last == nil {
			// Deleted before the watch saw it: nothing was reported, so nothing is owed.
			// Not deleted, it may have lived its whole life, and been collected, while
			// the watch had lost its place (an API server restart): then the events
			// service must hold the end it was planned to have.
			// A forged action is refused before it reports anything: the events service
			// owes no record under its name (checkTenants looks for any trace of it in
			// the project it forged).
			state, owed := flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED, flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED
			if !p.hostile || !forged(p.kind) {
				state, owed = ch.checkEvents(ctx, p, nil, wasDeleted, true, add), eventsink.ProtoPhase(p.expect)
				ch.checkWatchers(p, state, add)
			}
			if !wasDeleted && (!ch.obs.lostPlace() || state != owed) {
				add("%s: never seen by the watch (the events service says %s)", p.name, systemtest.PhaseName(state))
			}
			continue
		}
		st := r.last.Status
		if p.hostile {
			// Never deleted by the client, nor gone before it ended.
			ch.checkHostile(ctx, p, r, add)
			continue
		}
		switch {
		case wasDeleted && !r.gone:
			add("%s: deleted by the client but still there (Terminating, finalizers %v, phase %s)", p.name, r.last.Finalizers, st.Phase)
		case !wasDeleted && r.gone && !st.Phase.IsTerminal():
			// A finished action may go: the collector deletes it once its history is
			// delivered and gc.maxTTL has passed, or it is over gc.maxFinished. One whose
			// end and deletion both fell while the watch had lost its place is judged by
			// the events service's record alone (checkEvents), not by the last phase the
			// watch saw. Its events are checked below all the same.
			if !r.endUnseen {
				add("%s: gone although nobody deleted it (last phase %s)", p.name, systemtest.PhaseOrNone(string(st.Phase)))
			}
		case !wasDeleted && st.Phase != p.expect:
			add("%s: %s, want %s (reason %s)", p.name, systemtest.PhaseOrNone(string(st.Phase)), p.expect, systemtest.ProgressingReason(r.last))
		}
		ch.checkWatchers(p, ch.checkEvents(ctx, p, r.last, wasDeleted, r.endUnseen, add), add)
	}

	ch.checkTenants(ctx, add)
	problems = append(problems, ch.collectionProblems(ctx)...)

	ch.obs.mu.Lock()
	for name, uids := range ch.obs.podUIDs {
		if len(uids) > 1 {
			add("pod %s: created %d times under one name", name, len(uids))
		}
	}
	problems = append(problems, ch.obs.overlaps...)
	ch.obs.mu.Unlock()

	for _, p := range ch.s.allProcs() {
		for _, e := range p.ExitLog() {
			if !e.Expected {
				add("%s exited at %s without the soak causing it (%s); see %s", p.Name, e.At.Format(time.TimeOnly), e.Err, p.Log)
			}
		}
	}
	if ch.s.node != nil {
		problems = append(problems, ch.s.node.Exited()...)
	}
	ch.f.mu.Lock()
	problems = append(problems, ch.f.errs...)
	ch.f.mu.Unlock()
	sort.Strings(problems)
	return problems
}

// checkEvents holds the events service to what the executor wrote: its latest state is
// the action's final phase (Aborted for a deleted one that had started), and it holds
// every entry of the action's history exactly once. When the watch did not see the end
// (endUnseen: the action was gone by the time a new list was taken), the events service
// may also hold what the action wrote after the last version seen, and nothing else.
// It returns the events service's latest phase of the action (unspecified when it has
// none or could not say).
func (ch *checker) checkEvents(ctx context.Context, p *plan, last *flytev1.TaskAction, deleted, endUnseen bool, add func(string, ...any)) flytecorev1.ActionPhase {
	name := p.name
	if deleted {
		name += " (deleted by the client " + p.deletion + ")"
	}
	spec := p.action.Spec
	id := &flytecorev1.ActionIdentifier{Project: spec.Project, Domain: spec.Domain, Run: spec.RunName, Action: spec.ActionName}
	var history flytev1.PhaseHistory
	if last != nil {
		history = last.Status.PhaseHistory
	}
	// after says an event comes after the last entry the watch saw.
	after := func(k systemtest.EventKey) bool { return true }
	if lastSeen, ok := history.Last(); ok {
		after = func(k systemtest.EventKey) bool {
			return lastSeen.Mark().Before(flytev1.HistoryMark{Attempt: int32(k.Attempt), Version: int32(k.Version)})
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := ch.s.viewer.GetAction(cctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		if len(history) > 0 {
			add("%s: the events service has no record, but the executor wrote %d history entries", name, len(history))
		}
		return flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED
	case err != nil:
		add("%s: GetAction: %v", name, err)
		return flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED
	}
	state := got.Msg.GetAction().GetPhase()

	events, err := systemtest.ListActionEvents(ctx, ch.s.viewer, id)
	if err != nil {
		add("%s: ListActionEvents: %v", name, err)
		return state
	}
	// unseenEnd says the events service's state is an end the action wrote after the
	// watch last saw it.
	unseenEnd := false
	if endUnseen {
		for _, e := range events {
			k := systemtest.KeyOfEvent(e)
			unseenEnd = unseenEnd || (k.Phase == state && after(k) && eventstore.IsTerminal(state))
		}
	}

	if deleted {
		ok := state == flytecorev1.ActionPhase_ACTION_PHASE_ABORTED
		if last != nil && last.Status.Phase.IsTerminal() {
			ok = ok || state == eventsink.ProtoPhase(last.Status.Phase) // it ended before the delete
		}
		if !ok && !unseenEnd {
			add("%s: deleted, but the events service says %s (want ABORTED)", name, systemtest.PhaseName(state))
		}
	} else if endUnseen && last != nil && !last.Status.Phase.IsTerminal() {
		// Collected after an end the watch did not see: the end must be the planned one.
		if !unseenEnd || state != eventsink.ProtoPhase(p.expect) {
			add("%s: gone after %s unseen, and the events service says %s, want %s", name, last.Status.Phase, systemtest.PhaseName(state), p.expect)
		}
	} else if last != nil && state != eventsink.ProtoPhase(last.Status.Phase) {
		add("%s: the events service says %s, the action %s", name, systemtest.PhaseName(state), last.Status.Phase)
	}
	// Stored beside the history: an abort of a deleted action, an end the watch did not
	// see.
	extra := func(k systemtest.EventKey) bool {
		return (deleted && k.Phase == flytecorev1.ActionPhase_ACTION_PHASE_ABORTED) || (endUnseen && after(k))
	}
	systemtest.CheckHistoryStored(name, history, events, extra, add)
	return state
}

// checkWatchers holds every watcher to having seen the action's end, once the events
// service holds one.
func (ch *checker) checkWatchers(p *plan, end flytecorev1.ActionPhase, add func(string, ...any)) {
	if !eventstore.IsTerminal(end) {
		return
	}
	spec := p.action.Spec
	for _, m := range ch.ws.missed(idOf(spec.Project, spec.Domain, spec.RunName, spec.ActionName), end) {
		add("%s: every finish reaches every watcher: the events service says %s, but watcher %s", p.name, systemtest.PhaseName(end), m)
	}
}
