package cloudevents

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flytekube/backend/test/natstest"
)

const natsMaxPayload = 64 << 10

// startNATS runs a NATS server with JetStream in process on 127.0.0.1, storing in dir;
// port 0 picks a free port.
func startNATS(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	return natstest.JetStream(t, dir, port, func(o *server.Options) {
		o.MaxPayload, o.JetStreamMaxMemory, o.JetStreamMaxStore = natsMaxPayload, 64<<20, 256<<20
	})
}

func natsPort(s *server.Server) int { return natstest.Port(s) }

// jetStream connects a test client (the consumer's side).
func jetStream(t testing.TB, s *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
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

func createStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	st, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// readStream reads the stream from its start with an ordered consumer until it has n
// messages, decoding each as a structured CloudEvent.
func readStream(t testing.TB, st jetstream.Stream, n int) ([]event.Event, []jetstream.Msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		events []event.Event
		msgs   []jetstream.Msg
	)
	for len(msgs) < n && ctx.Err() == nil {
		batch, err := cons.Fetch(n-len(msgs), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var e event.Event
			if err := format.JSON.Unmarshal(m.Data(), &e); err != nil {
				t.Fatalf("message %d is not a structured CloudEvent: %v", len(msgs), err)
			}
			events = append(events, e)
			msgs = append(msgs, m)
		}
	}
	if len(msgs) != n {
		t.Fatalf("read %d messages, want %d", len(msgs), n)
	}
	return events, msgs
}

func storedMsgs(t testing.TB, st jetstream.Stream) uint64 {
	t.Helper()
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// natsSpec is a sink of the server's subject (flyte.actions unless given), checked
// against stream when given, with a timeout of to (the default unless given).
func natsSpec(s *server.Server, subject, stream, to string) SinkSpec {
	return SinkSpec{NATS: &NATSSpec{Servers: []string{fmt.Sprintf("127.0.0.1:%d", natsPort(s))}, Subject: subject, Stream: stream, Timeout: to}}
}

func TestNATSDelivers(t *testing.T) {
	srv := startNATS(t, t.TempDir(), 0)
	js := jetStream(t, srv)
	st := createStream(t, js, jetstream.StreamConfig{Name: "FLYTE", Subjects: []string{"flyte.actions"}, Duplicates: time.Minute})
	sink := openSink(t, natsSpec(srv, "", "FLYTE", "5s"))

	// More than the window of publishes awaiting acknowledgement, over several calls.
	events := cloudEvents(t, 3*natsInFlight+17, 7)
	for _, batch := range [][]event.Event{events[:10], events[10:]} {
		results, err := sink.Publish(context.Background(), batch)
		if err != nil {
			t.Fatal(err)
		}
		if want := slices.Repeat([]Outcome{Delivered}, len(batch)); !slices.Equal(outcomes(results), want) {
			t.Fatalf("outcomes %v, want all %d delivered", outcomes(results), len(batch))
		}
	}
	got, msgs := readStream(t, st, len(events))
	if !slices.Equal(ids(got), ids(events)) {
		t.Fatalf("the stream holds %v..., want %v... in order", ids(got)[:5], ids(events)[:5])
	}
	for i, e := range got {
		want := events[i]
		if e.Type() != want.Type() || e.Source() != want.Source() || string(e.Data()) != string(want.Data()) || attempt(t, e) != 1 {
			t.Errorf("read %v\nsent %v", e, want)
		}
		h := msgs[i].Headers()
		if h.Get(jetstream.MsgIDHeader) != MsgID(&want) || h.Get("Content-Type") != event.ApplicationCloudEventsJSON {
			t.Errorf("message %d headers %v", i, h)
		}
	}
}

func TestNATSDuplicateWindow(t *testing.T) {
	srv := startNATS(t, t.TempDir(), 0)
	st := createStream(t, jetStream(t, srv), jetstream.StreamConfig{Name: "FLYTE", Subjects: []string{"flyte.actions"}, Duplicates: time.Minute})
	sink := openSink(t, natsSpec(srv, "", "", ""))
	events := cloudEvents(t, 3, 3)
	// The whole batch again (a lost acknowledgement), then one event twice in a batch.
	for _, batch := range [][]event.Event{events, events, {events[1], events[1]}} {
		results, err := sink.Publish(context.Background(), batch)
		if err != nil {
			t.Fatal(err)
		}
		if want := slices.Repeat([]Outcome{Delivered}, len(batch)); !slices.Equal(outcomes(results), want) {
			t.Fatalf("outcomes %v, want all delivered (a duplicate is acknowledged)", results)
		}
	}
	if n := storedMsgs(t, st); n != uint64(len(events)) {
		t.Errorf("the stream holds %d messages, want %d: duplicates were stored", n, len(events))
	}
	got, _ := readStream(t, st, len(events))
	if !slices.Equal(ids(got), ids(events)) {
		t.Errorf("the stream holds %v, want %v", ids(got), ids(events))
	}
}

func TestNATSRejectsTooLarge(t *testing.T) {
	srv := startNATS(t, t.TempDir(), 0)
	js := jetStream(t, srv)
	createStream(t, js, jetstream.StreamConfig{Name: "FLYTE", Subjects: []string{"flyte.actions"}})
	createStream(t, js, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"flyte.small"}, MaxMsgSize: 4 << 10})
	events := cloudEvents(t, 3, 3)

	tests := []struct {
		name, subject, detail string
		size                  int
	}{
		{"over the server's max payload", "", "maximum payload exceeded", natsMaxPayload + 1},
		{"over the stream's max message size", "flyte.small", "message size exceeds maximum allowed", 8 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sink := openSink(t, natsSpec(srv, tc.subject, "", ""))
			batch := []event.Event{events[0], withData(t, events[1], tc.size), events[2]}
			results, err := sink.Publish(context.Background(), batch)
			if err != nil {
				t.Fatal(err)
			}
			if want := []Outcome{Delivered, Reject, Delivered}; !slices.Equal(outcomes(results), want) {
				t.Fatalf("outcomes %v, want %v", results, want)
			}
			if !strings.Contains(results[1].Detail, tc.detail) {
				t.Errorf("detail %q, want it to say %q", results[1].Detail, tc.detail)
			}
		})
	}
}

func TestNATSRetriesWithoutAStream(t *testing.T) {
	srv := startNATS(t, t.TempDir(), 0)
	createStream(t, jetStream(t, srv), jetstream.StreamConfig{Name: "FLYTE", Subjects: []string{"flyte.actions"}})
	events := cloudEvents(t, 5, 5)
	tests := []struct{ name, subject, stream, detail string }{
		{"no stream stores the subject", "flyte.nowhere", "", "no stream"},
		{"the subject is in another stream", "", "OTHER", "expected stream does not match"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sink := openSink(t, natsSpec(srv, tc.subject, tc.stream, "2s"))
			results, err := sink.Publish(context.Background(), events)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(outcomes(results), []Outcome{Retry}) || !strings.Contains(results[0].Detail, tc.detail) {
				t.Errorf("results %v, want one Retry saying %q", results, tc.detail)
			}
		})
	}
}

// The server stops: Publish reports Retry; it comes back (same port, same store): the
// events are delivered, each stored once.
func TestNATSBrokerOutage(t *testing.T) {
	dir := t.TempDir()
	srv := startNATS(t, dir, 0)
	port := natsPort(srv)
	createStream(t, jetStream(t, srv), jetstream.StreamConfig{Name: "FLYTE", Subjects: []string{"flyte.actions"}, Duplicates: time.Minute})
	sink := openSink(t, natsSpec(srv, "", "", "1s"))
	events := cloudEvents(t, 40, 4)

	if results, err := sink.Publish(context.Background(), events[:10]); err != nil || len(results) != 10 || results[9].Outcome != Delivered {
		t.Fatalf("before the outage: %v, %v", results, err)
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	start := time.Now()
	results, err := sink.Publish(context.Background(), events[10:])
	if err != nil {
		t.Fatal(err)
	}
	if len(results) == 0 || results[len(results)-1].Outcome != Retry || slices.Contains(outcomes(results), Reject) {
		t.Fatalf("while the server is down: %v, want a prefix ending in Retry", results)
	}
	t.Logf("down: %d delivered, then Retry (%s) after %s", len(results)-1, results[len(results)-1].Detail, time.Since(start))
	next := 10 + len(results) - 1

	srv = startNATS(t, dir, port)
	st, err := jetStream(t, srv).Stream(context.Background(), "FLYTE")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for next < len(events) {
		if time.Now().After(deadline) {
			t.Fatalf("events from %d on not delivered after the restart", next)
		}
		results, err := sink.Publish(context.Background(), events[next:])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Outcome == Delivered {
				next++
			}
		}
		if len(results) > 0 && results[len(results)-1].Outcome == Retry {
			time.Sleep(100 * time.Millisecond)
		}
	}
	got, _ := readStream(t, st, len(events))
	if !slices.Equal(ids(got), ids(events)) {
		t.Errorf("the stream holds %v, want %v", ids(got), ids(events))
	}
	if n := storedMsgs(t, st); n != uint64(len(events)) {
		t.Errorf("the stream holds %d messages, want %d", n, len(events))
	}
}

// A sink opened while the server is down waits for it rather than failing.
func TestNATSOpensBeforeTheServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	sink := openSink(t, SinkSpec{NATS: &NATSSpec{Servers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Timeout: "1s"}})
	events := cloudEvents(t, 2, 2)
	results, err := sink.Publish(context.Background(), events)
	if err != nil || !slices.Equal(outcomes(results), []Outcome{Retry}) {
		t.Fatalf("before the server: %v, %v; want one Retry", results, err)
	}
	srv := startNATS(t, t.TempDir(), port)
	createStream(t, jetStream(t, srv), jetstream.StreamConfig{Name: "FLYTE", Subjects: []string{"flyte.actions"}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		results, err := sink.Publish(context.Background(), events)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(outcomes(results), []Outcome{Delivered, Delivered}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered after the server started: %v", results)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
