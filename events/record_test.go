package events_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

func TestRecordAbsorbsRedelivery(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	id := actionID("r1", "a0")
	batch := []*eventsv1.ActionEvent{
		event(id, 1, queued, 0, 1), event(id, 1, running, 0, 2), event(id, 1, running, 1, 3), event(id, 1, succeeded, 0, 4),
	}
	if got := record(t, inst.client, batch...); got.GetRecorded() != 4 || got.GetDuplicates() != 0 {
		t.Fatalf("first delivery: %v; want 4 new", got)
	}
	if got := record(t, inst.client, batch...); got.GetRecorded() != 0 || got.GetDuplicates() != 4 {
		t.Fatalf("redelivery: %v; want 4 duplicates", got)
	}
	// Partly new: only the new one counts, and a repeat inside one batch is absorbed too.
	extra := event(id, 2, queued, 0, 5)
	if got := record(t, inst.client, batch[0], extra, extra); got.GetRecorded() != 1 || got.GetDuplicates() != 2 {
		t.Fatalf("mixed batch: %v; want 1 new, 2 duplicates", got)
	}
	resp, err := inst.client.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.Msg.GetEvents()); n != 5 {
		t.Fatalf("stored %d events; want 5", n)
	}
	if got := stateString(getAction(t, inst.client, id)); !strings.HasPrefix(got, "attempt 2 ACTION_PHASE_QUEUED") {
		t.Fatalf("state %s; want attempt 2 queued", got)
	}
}

// TestClusterEventsRoundTrip: every field of a cluster event, the component that reported
// it among them, is stored and served back as recorded.
func TestClusterEventsRoundTrip(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	id := actionID("r1", "a0")
	e := event(id, 1, running, 0, 1)
	e.ClusterEvents = []*eventsv1.ClusterEvent{
		{OccurredAt: e.GetOccurredAt(), Object: "Pod/a0-1", Type: "Normal", Reason: "Scheduled", Message: "Successfully assigned ns/a0-1 to node-1", Source: "default-scheduler", Count: 1},
		{OccurredAt: e.GetOccurredAt(), Object: "Pod/a0-1", Type: "Warning", Reason: "BackOff", Message: "Back-off pulling image", Source: "kubelet", Count: 3},
	}
	record(t, inst.client, e)
	resp, err := inst.client.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id}))
	if err != nil {
		t.Fatal(err)
	}
	if evs := resp.Msg.GetEvents(); len(evs) != 1 || len(evs[0].GetClusterEvents()) != 2 {
		t.Fatalf("listed %v; want the one event with its 2 cluster events", evs)
	}
	for i, got := range resp.Msg.GetEvents()[0].GetClusterEvents() {
		if want := e.GetClusterEvents()[i]; !proto.Equal(got, want) {
			t.Errorf("cluster event %d served back as %v; recorded %v", i, got, want)
		}
	}
}

func TestFoldRules(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	tests := []struct {
		name string
		// deliveries are recorded in order, one batch each.
		deliveries [][]*eventsv1.ActionEvent
		want       string
	}{
		{
			name:       "a late non-terminal event does not undo a terminal one",
			deliveries: [][]*eventsv1.ActionEvent{{ev(1, succeeded, 0, 5)}, {ev(1, running, 0, 3)}},
			want:       "attempt 1 ACTION_PHASE_SUCCEEDED v0",
		},
		{
			name:       "terminal beats non-terminal even with an earlier clock",
			deliveries: [][]*eventsv1.ActionEvent{{ev(1, running, 3, 9)}, {ev(1, failed, 0, 8)}},
			want:       "attempt 1 ACTION_PHASE_FAILED v0",
		},
		{
			name:       "a newer attempt beats an older one's terminal phase",
			deliveries: [][]*eventsv1.ActionEvent{{ev(2, queued, 0, 6)}, {ev(1, failed, 0, 5)}},
			want:       "attempt 2 ACTION_PHASE_QUEUED v0",
		},
		{
			name:       "a higher version beats a lower one despite clock skew",
			deliveries: [][]*eventsv1.ActionEvent{{ev(1, running, 2, 3)}, {ev(1, running, 1, 4)}},
			want:       "attempt 1 ACTION_PHASE_RUNNING v2",
		},
		{
			name:       "phases move forward within an attempt",
			deliveries: [][]*eventsv1.ActionEvent{{ev(1, running, 0, 3)}, {ev(1, initialized, 0, 2)}, {ev(1, waiting, 0, 1)}},
			want:       "attempt 1 ACTION_PHASE_RUNNING v0",
		},
		{
			name:       "two terminal phases tie on rank and version; the later one wins",
			deliveries: [][]*eventsv1.ActionEvent{{ev(1, aborted, 0, 7)}, {ev(1, failed, 0, 6)}},
			want:       "attempt 1 ACTION_PHASE_ABORTED v0",
		},
		{
			name:       "within one batch the greatest state wins",
			deliveries: [][]*eventsv1.ActionEvent{{ev(1, running, 0, 3), ev(1, succeeded, 0, 4), ev(1, queued, 0, 1)}},
			want:       "attempt 1 ACTION_PHASE_SUCCEEDED v0",
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := actionID("fold", fmt.Sprintf("a%d", i))
			for _, d := range tt.deliveries {
				for _, e := range d {
					e.Id = id
				}
				record(t, inst.client, d...)
			}
			if got := stateString(getAction(t, inst.client, id)); !strings.HasPrefix(got, tt.want) {
				t.Fatalf("state %s; want %s", got, tt.want)
			}
		})
	}
}

// ev is an event whose identifier the caller fills in.
func ev(attempt uint32, phase flytecorev1.ActionPhase, version uint32, at int) *eventsv1.ActionEvent {
	return event(nil, attempt, phase, version, at)
}

// history is an action's full life: two attempts, the first failing.
func history(run, action string) []*eventsv1.ActionEvent {
	id := actionID(run, action)
	return []*eventsv1.ActionEvent{
		event(id, 1, queued, 0, 1), event(id, 1, initialized, 0, 2), event(id, 1, running, 0, 3),
		event(id, 1, running, 1, 4), event(id, 1, failed, 0, 5),
		event(id, 2, queued, 0, 6), event(id, 2, waiting, 0, 7), event(id, 2, waiting, 1, 8),
		event(id, 2, initialized, 0, 9), event(id, 2, running, 0, 10), event(id, 2, succeeded, 0, 11),
	}
}

const finalState = "attempt 2 ACTION_PHASE_SUCCEEDED v0"

// shuffledBatches delivers evs in a random order, cut into random batches, with some
// events delivered twice.
func shuffledBatches(rng *rand.Rand, evs []*eventsv1.ActionEvent) [][]*eventsv1.ActionEvent {
	all := append([]*eventsv1.ActionEvent(nil), evs...)
	for _, e := range evs {
		if rng.IntN(3) == 0 {
			all = append(all, e)
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	var out [][]*eventsv1.ActionEvent
	for len(all) > 0 {
		n := 1 + rng.IntN(min(4, len(all)))
		out = append(out, all[:n])
		all = all[n:]
	}
	return out
}

func TestReorderedDeliveryFoldsToTheRightState(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 30 {
		h := history("reorder", fmt.Sprintf("a%d", i))
		for _, batch := range shuffledBatches(rng, h) {
			record(t, inst.client, batch...)
		}
		if got := stateString(getAction(t, inst.client, h[0].GetId())); !strings.HasPrefix(got, finalState) {
			t.Fatalf("permutation %d: state %s; want %s", i, got, finalState)
		}
	}
}

func TestConcurrentWritersAgree(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	const writers, actions = 16, 5
	var all []*eventsv1.ActionEvent
	for a := range actions {
		all = append(all, history("concurrent", fmt.Sprintf("a%d", a))...)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		recorded uint32
	)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for _, batch := range shuffledBatches(rng, all) {
				resp, err := inst.client.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: batch}))
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				mu.Lock()
				recorded += resp.Msg.GetRecorded()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if recorded != uint32(len(all)) {
		t.Fatalf("writers saw %d events recorded as new in total; want exactly %d", recorded, len(all))
	}
	for a := range actions {
		id := actionID("concurrent", fmt.Sprintf("a%d", a))
		if got := stateString(getAction(t, inst.client, id)); !strings.HasPrefix(got, finalState) {
			t.Fatalf("action %d: state %s; want %s", a, got, finalState)
		}
	}
}
