package executorbench

import (
	"context"
	"fmt"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/eventsink"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
)

// historyRecorder records an action's history with the events service before the
// ceiling writes its status, as an executor must that spares the finalizer (the events
// service then holds what a deletion could otherwise lose): with it, the ceiling costs
// what that guarantee costs at least. The calls of concurrent creators that arrive while
// one is on its way go together in the next (a group commit), as the executor's delivery
// batches, so that the bound is not a transaction per action.
type historyRecorder struct {
	client eventsv1connect.EventsServiceClient

	mu      sync.Mutex
	queue   []historyCall
	sending bool // a send loop runs
}

type historyCall struct {
	events []*eventsv1.ActionEvent
	done   chan error // buffered: the loop never waits for its caller
}

func newHistoryRecorder(eventsURL string) (*historyRecorder, error) {
	c, err := eventsink.NewClient(eventsURL, rpcclient.Options{})
	if err != nil {
		return nil, fmt.Errorf("history recorder: %w", err)
	}
	return &historyRecorder{client: c}, nil
}

// record records the history of ta's status, as the executor reports it, and returns
// once the events service has it.
func (h *historyRecorder) record(ctx context.Context, ta *flytev1.TaskAction) error {
	call := historyCall{done: make(chan error, 1)}
	now := timestamppb.Now()
	for _, t := range ta.Status.PhaseHistory {
		call.events = append(call.events, &eventsv1.ActionEvent{
			Id:      &flytecorev1.ActionIdentifier{Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName},
			Attempt: uint32(t.Attempt), Phase: eventsink.ProtoPhase(t.Phase), Version: uint32(t.Version),
			OccurredAt: timestamppb.New(t.OccurredAt.Time), ReportedAt: now, Reason: t.Reason, TaskType: ta.Spec.TaskType,
		})
	}
	h.mu.Lock()
	h.queue = append(h.queue, call)
	if !h.sending {
		h.sending = true
		go h.send()
	}
	h.mu.Unlock()
	select {
	case err := <-call.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send records the waiting calls, all of those waiting in one Record, until none wait.
func (h *historyRecorder) send() {
	for {
		h.mu.Lock()
		calls := h.queue
		h.queue = nil
		if len(calls) == 0 {
			h.sending = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		var batch []*eventsv1.ActionEvent
		for _, c := range calls {
			batch = append(batch, c.events...)
		}
		_, err := h.client.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: batch}))
		if err != nil {
			err = fmt.Errorf("recording %d events: %w", len(batch), err)
		}
		for _, c := range calls {
			c.done <- err
		}
	}
}
