package cloudevents

import (
	"context"
	"strconv"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkPublish measures each sink's rate in batches of 100 events against the
// in-process receivers of the tests (one machine: the receiver's cost is included).
//
//	go test -run '^$' -bench Publish ./events/cloudevents/
func BenchmarkPublish(b *testing.B) {
	const batch = 100
	events := cloudEvents(b, 10*batch, 50)
	// run publishes batches; fresh gives batch n its events (by default, a slice of
	// events, sent again and again).
	run := func(b *testing.B, sink Sink, fresh func(n int) []event.Event) {
		if fresh == nil {
			fresh = func(n int) []event.Event {
				from := (n * batch) % len(events)
				return events[from : from+batch]
			}
		}
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			results, err := sink.Publish(context.Background(), fresh(n))
			if err != nil || len(results) != batch || results[batch-1].Outcome != Delivered {
				b.Fatalf("%v, %v", results, err)
			}
			n++
		}
		b.ReportMetric(float64(n*batch)/b.Elapsed().Seconds(), "events/s")
	}
	b.Run("http", func(b *testing.B) {
		run(b, openSink(b, SinkSpec{HTTP: serve(b, newReceiver(b), false)}), nil)
	})
	b.Run("http2", func(b *testing.B) {
		run(b, openSink(b, SinkSpec{HTTP: serve(b, newReceiver(b), true)}), nil)
	})
	b.Run("nats", func(b *testing.B) {
		srv := startNATS(b, b.TempDir(), 0)
		createStream(b, jetStream(b, srv), jetstream.StreamConfig{Name: "FLYTE", Subjects: []string{"flyte.actions"}})
		// Every batch gets new ids: the same ids again would be dropped as duplicates,
		// which costs the server less than storing them.
		out := make([]event.Event, batch)
		run(b, openSink(b, natsSpec(srv, "", "", "")), func(n int) []event.Event {
			for i := range out {
				out[i] = events[i].Clone()
				out[i].SetID(events[i].ID() + "/" + strconv.Itoa(n))
			}
			return out
		})
	})
	b.Run("kafka", func(b *testing.B) {
		run(b, openSink(b, kafkaSpec(startKafka(b, 0, ""), "", "")), nil)
	})
}
