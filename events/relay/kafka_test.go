package relay_test

// Kafka is stood in for by kfake, franz-go's in-process Kafka-protocol broker: a real
// Kafka broker cannot run on this machine (no JVM, no containers).

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flytekube/backend/events/cloudevents"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// Eight writers, redeliveries included, through the relay to a topic of 4 partitions:
// a consumer reads every event once, each action's in order (an action keeps to one
// partition, keyed by its partitionkey).
func TestKafkaGetsEveryEventOnceInOrderPerAction(t *testing.T) {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "flyte-actions"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	sink, err := cloudevents.SinkSpec{Name: "kafka", Kafka: &cloudevents.KafkaSpec{Brokers: broker.ListenAddrs(), Topic: "flyte-actions"}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	d := newDB(t)
	startRelay(t, d, sink)
	registered(t, d, "kafka")

	const writers, actions = 8, 5
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for a := range actions {
				evs := actionEvents(fmt.Sprintf("kafka-%d", w), fmt.Sprintf("a%d", a))
				d.record(t, evs[:2]...)
				d.record(t, evs[:2]...) // a redelivery
				d.record(t, evs[2:]...)
			}
		})
	}
	wg.Wait()
	want := writers * actions * len(lifecycle)
	inOrderOnce(t, consumeKafka(t, broker.ListenAddrs(), want), want)
}

// consumeKafka reads n records of the topic from its start, as a consumer of the
// events would, in binary mode: the attributes in ce_ headers, the event as the body.
func consumeKafka(t *testing.T, addrs []string, n int) []received {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("flyte-actions"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []received
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records", len(out), n)
		}
		fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetching %s/%d: %v", topic, p, err) })
		for _, r := range fetches.Records() {
			h := map[string]string{}
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			var body eventsv1.ActionEvent
			if err := jsonData(r.Value, &body); err != nil {
				t.Fatal(err)
			}
			out = append(out, received{id: h["ce_id"], run: h["ce_flyterun"], action: h["ce_flyteaction"],
				attempt: int32(body.GetAttempt()), version: int32(body.GetVersion())})
		}
	}
	return out
}
