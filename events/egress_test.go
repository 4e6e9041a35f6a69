package events_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/cloudevents"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/eventually"
)

// The service relays what Record stores to its sinks; what a sink refuses for good is
// listed by EgressService, and replayed on request once the sink takes it.
func TestEgressOverTheService(t *testing.T) {
	var refusing atomic.Bool
	refusing.Store(true)
	var accepted atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refusing.Load() {
			http.Error(w, "no such schema", http.StatusUnprocessableEntity)
			return
		}
		accepted.Add(1)
	}))
	t.Cleanup(receiver.Close)
	sink, err := cloudevents.Parse(receiver.URL + "?name=receiver")
	if err != nil {
		t.Fatal(err)
	}
	// Recorded as soon as the service answers, before its relay leads: the service
	// registered its sinks before serving, so nothing it acknowledges goes unqueued.
	dbURL := pg.NewDatabase(t)
	inst := startInstance(t, dbURL, func(c *events.Config) {
		c.CloudEvents.Sinks = append(c.CloudEvents.Sinks, sink)
		c.CloudEvents.Poll = 20 * time.Millisecond
		c.CloudEvents.LeaderCheck = time.Second
	})
	egress := eventsv1connect.NewEgressServiceClient(inst.HTTP, inst.URL, connect.WithGRPC())
	ctx := context.Background()
	listSinks := func() *eventsv1.Sink {
		t.Helper()
		resp, err := egress.ListSinks(ctx, connect.NewRequest(&eventsv1.ListSinksRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.GetSinks()) != 1 {
			t.Fatalf("sinks: %v", resp.Msg.GetSinks())
		}
		return resp.Msg.GetSinks()[0]
	}
	if target := listSinks().GetTarget(); target != receiver.URL {
		t.Errorf("the sink's target: %q", target)
	}
	record(t, inst.client, event(actionID("egress", "a"), 1, queued, 0, 0), event(actionID("egress", "a"), 1, running, 1, 1))
	eventually.True(t, 20*time.Second, func() bool { return listSinks().GetDeadLetters() == 2 },
		func() string { return "the refused events are not counted as dead letters" })
	listed, err := egress.ListDeadLetters(ctx, connect.NewRequest(&eventsv1.ListDeadLettersRequest{Sink: "receiver", PageSize: 1}))
	if err != nil {
		t.Fatal(err)
	}
	letters := listed.Msg.GetDeadLetters()
	if len(letters) != 1 || listed.Msg.GetNextPageToken() == "" || letters[0].GetEvent().GetPhase() != queued ||
		!strings.HasPrefix(letters[0].GetDetail(), "HTTP 422") || letters[0].GetReplayRequested() {
		t.Fatalf("first page of dead letters: %v (next %q)", letters, listed.Msg.GetNextPageToken())
	}
	next, err := egress.ListDeadLetters(ctx, connect.NewRequest(&eventsv1.ListDeadLettersRequest{Sink: "receiver", PageToken: listed.Msg.GetNextPageToken()}))
	if err != nil || len(next.Msg.GetDeadLetters()) != 1 || next.Msg.GetDeadLetters()[0].GetEvent().GetPhase() != running {
		t.Fatalf("second page: %v, %v", next.Msg.GetDeadLetters(), err)
	}

	// Ids and all together are refused by the contract's rule.
	_, err = egress.ReplayDeadLetters(ctx, connect.NewRequest(&eventsv1.ReplayDeadLettersRequest{Sink: "receiver", Ids: []int64{letters[0].GetId()}, All: true}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("ids and all: %v", err)
	}
	refusing.Store(false)
	replay, err := egress.ReplayDeadLetters(ctx, connect.NewRequest(&eventsv1.ReplayDeadLettersRequest{Sink: "receiver", Ids: []int64{letters[0].GetId()}}))
	if err != nil || replay.Msg.GetRequested() != 1 {
		t.Fatalf("replaying one: %v, %v", replay, err)
	}
	eventually.True(t, 20*time.Second, func() bool { return accepted.Load() == 1 && listSinks().GetDeadLetters() == 1 },
		func() string { return "the replayed dead letter was not delivered, or not removed" })
	if _, err := egress.ReplayDeadLetters(ctx, connect.NewRequest(&eventsv1.ReplayDeadLettersRequest{Sink: "receiver", All: true})); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 20*time.Second, func() bool { return accepted.Load() == 2 && listSinks().GetDeadLetters() == 0 },
		func() string { return "replaying all left some" })
}
