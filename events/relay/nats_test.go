package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flytekube/backend/events/cloudevents"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/natstest"
)

// The NATS server stopped while events are recorded, then started again on its store:
// the stream ends up with every event once, each action's in order.
func TestNATSStoppedThenBackLosesNothing(t *testing.T) {
	d := newDB(t)
	dir := t.TempDir()
	ns := natstest.JetStream(t, dir, 0)
	port := natstest.Port(ns)
	stream := createStream(t, ns)
	sink, err := cloudevents.SinkSpec{Name: "nats", NATS: &cloudevents.NATSSpec{
		Servers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Subject: "flyte.actions", Stream: "FLYTE_ACTIONS", Timeout: "1s",
	}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, d, sink)
	registered(t, d, "nats")

	const actions = 10
	for a := range actions / 2 {
		d.record(t, actionEvents("nats", fmt.Sprintf("a%d", a))...)
	}
	eventually.True(t, 30*time.Second, func() bool { return stored(t, stream) == uint64(actions/2*len(lifecycle)) },
		func() string { return fmt.Sprintf("%d stored before the outage", stored(t, stream)) })

	ns.Shutdown()
	ns.WaitForShutdown()
	for a := actions / 2; a < actions; a++ {
		d.record(t, actionEvents("nats", fmt.Sprintf("a%d", a))...)
	}
	eventually.True(t, 30*time.Second, func() bool { return r.counter(t, "flyte_events_cloudevents_retries_total", "nats") >= 2 },
		func() string { return "the relay did not try during the outage" })
	ns = natstest.JetStream(t, dir, port)
	stream = openStream(t, ns)
	want := actions * len(lifecycle)
	eventually.True(t, 60*time.Second, func() bool { return stored(t, stream) >= uint64(want) },
		func() string { return fmt.Sprintf("%d of %d stored after the outage", stored(t, stream), want) })
	inOrderOnce(t, readAll(t, stream, want), want)
}

func createStream(t *testing.T, ns *server.Server) jetstream.Stream {
	t.Helper()
	st, err := jetStream(t, ns).CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "FLYTE_ACTIONS", Subjects: []string{"flyte.actions"}, Duplicates: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func openStream(t *testing.T, ns *server.Server) jetstream.Stream {
	t.Helper()
	var st jetstream.Stream
	eventually.True(t, 20*time.Second, func() bool {
		var err error
		st, err = jetStream(t, ns).Stream(context.Background(), "FLYTE_ACTIONS")
		return err == nil
	}, func() string { return "the stream did not come back with the server" })
	return st
}

func jetStream(t *testing.T, ns *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func stored(t *testing.T, st jetstream.Stream) uint64 {
	t.Helper()
	info, err := st.Info(context.Background())
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// readAll reads n messages from the stream's start, as a consumer of the events would.
func readAll(t *testing.T, st jetstream.Stream, n int) []received {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []received
	for len(out) < n && ctx.Err() == nil {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var e event.Event
			if err := format.JSON.Unmarshal(m.Data(), &e); err != nil {
				t.Fatalf("message %d is not a structured CloudEvent: %v", len(out), err)
			}
			var body eventsv1.ActionEvent
			if err := jsonData(e.Data(), &body); err != nil {
				t.Fatal(err)
			}
			ext := e.Extensions()
			out = append(out, received{id: e.ID(), run: fmt.Sprint(ext["flyterun"]), action: fmt.Sprint(ext["flyteaction"]),
				attempt: int32(body.GetAttempt()), version: int32(body.GetVersion())})
		}
	}
	return out
}
