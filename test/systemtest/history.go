package systemtest

import (
	"fmt"
	"strings"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/eventsink"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// EventKey is the identity of an event within an action: (attempt, phase, version),
// what the events service records it by.
type EventKey struct {
	Attempt uint32
	Phase   flytecorev1.ActionPhase
	Version uint32
}

// KeyOfEvent is the key of an event the events service holds.
func KeyOfEvent(e *eventsv1.ActionEvent) EventKey {
	return EventKey{e.GetAttempt(), e.GetPhase(), e.GetVersion()}
}

// KeyOfEntry is the key the executor sends a phase history entry under.
func KeyOfEntry(h flytev1.PhaseTransition) EventKey {
	return EventKey{uint32(h.Attempt), eventsink.ProtoPhase(h.Phase), uint32(h.Version)}
}

func (k EventKey) String() string {
	return fmt.Sprintf("(attempt %d, %s, v%d)", k.Attempt, PhaseName(k.Phase), k.Version)
}

// PhaseName is a contract phase without its enum prefix (QUEUED, SUCCEEDED, ...).
func PhaseName(p flytecorev1.ActionPhase) string {
	return strings.TrimPrefix(p.String(), "ACTION_PHASE_")
}

// CheckHistoryStored holds what the events service stores of an action (events) to what
// the executor wrote (history): every entry stored once, and nothing else but the
// events extra allows (nil allows none). name names the action in what add is told.
func CheckHistoryStored(name string, history flytev1.PhaseHistory, events []*eventsv1.ActionEvent, extra func(EventKey) bool, add func(string, ...any)) {
	stored := map[EventKey]int{}
	keys := make([]string, 0, len(events))
	for _, e := range events {
		k := KeyOfEvent(e)
		stored[k]++
		keys = append(keys, k.String())
	}
	wrote := map[EventKey]bool{}
	for _, h := range history {
		k := KeyOfEntry(h)
		wrote[k] = true
		switch n := stored[k]; {
		case n == 0:
			add("%s: history entry %s never reached the events service; it holds %s", name, k, strings.Join(keys, " "))
		case n > 1:
			add("%s: history entry %s stored %d times", name, k, n)
		}
	}
	for k, n := range stored {
		switch {
		case wrote[k]:
		case extra != nil && extra(k):
			if n > 1 {
				add("%s: the events service holds %s %d times", name, k, n)
			}
		default:
			add("%s: the events service holds %s (%d times), which is not in the action's history", name, k, n)
		}
	}
}
