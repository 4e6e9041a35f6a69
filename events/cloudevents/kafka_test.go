package cloudevents

// Kafka is stood in for by kfake, franz-go's in-process Kafka-protocol broker: a real
// Kafka broker cannot run on the build machine (no JVM, no containers).

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

const kafkaTopicName = "flyte-actions"

// startKafka runs a one-broker kfake cluster on 127.0.0.1 with the topic in 4
// partitions; port 0 picks a free port. With a dataDir, the cluster keeps its state
// there and a new one on the same directory takes it up.
func startKafka(t testing.TB, port int, dataDir string) *kfake.Cluster {
	t.Helper()
	// The topic is seeded only when the data directory holds no state yet.
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(4, kafkaTopicName)}
	if dataDir != "" {
		opts = append(opts, kfake.DataDir(dataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// kafkaSpec is a sink of the cluster's topic in mode (binary unless given) with a
// timeout of to (the default unless given).
func kafkaSpec(c *kfake.Cluster, mode Mode, to string) SinkSpec {
	return SinkSpec{Kafka: &KafkaSpec{Brokers: c.ListenAddrs(), Topic: kafkaTopicName, Mode: mode, Timeout: to}}
}

// consume reads n records of the topic from its start.
func consume(t testing.TB, addrs []string, n int) []*kgo.Record {
	t.Helper()
	var out []*kgo.Record
	consumeUntil(t, addrs, func(r *kgo.Record) bool {
		out = append(out, r)
		return len(out) == n
	})
	return out
}

// consumeUntil reads the topic from its start, record by record, until done says so.
func consumeUntil(t testing.TB, addrs []string, done func(*kgo.Record) bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(kafkaTopicName), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("the topic ended before the test had read what it wanted")
		}
		fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetching %s/%d: %v", topic, p, err) })
		for _, r := range fetches.Records() {
			if done(r) {
				return
			}
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// decodeRecord reads a record back as a CloudEvent, per the Kafka protocol binding.
func decodeRecord(t testing.TB, r *kgo.Record) event.Event {
	t.Helper()
	if ct := header(r, "content-type"); ct == event.ApplicationCloudEventsJSON {
		var e event.Event
		if err := format.JSON.Unmarshal(r.Value, &e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := event.New(header(r, "ce_specversion"))
	for _, h := range r.Headers {
		name, ok := strings.CutPrefix(h.Key, "ce_")
		switch {
		case !ok:
		case name == "id":
			e.SetID(string(h.Value))
		case name == "source":
			e.SetSource(string(h.Value))
		case name == "type":
			e.SetType(string(h.Value))
		case name == "subject":
			e.SetSubject(string(h.Value))
		case name == "time":
			tm, err := time.Parse(time.RFC3339Nano, string(h.Value))
			if err != nil {
				t.Fatal(err)
			}
			e.SetTime(tm)
		case name != "specversion":
			e.SetExtension(name, string(h.Value))
		}
	}
	if err := e.SetData(header(r, "content-type"), r.Value); err != nil {
		t.Fatal(err)
	}
	if err := e.Validate(); err != nil {
		t.Fatalf("record %s/%d@%d is not a CloudEvent: %v", r.Topic, r.Partition, r.Offset, err)
	}
	return e
}

func TestKafkaDelivers(t *testing.T) {
	for _, mode := range []Mode{Binary, Structured} {
		t.Run(string(mode), func(t *testing.T) {
			cluster := startKafka(t, 0, "")
			sink := openSink(t, kafkaSpec(cluster, mode, ""))
			events := cloudEvents(t, 300, 11)
			for _, batch := range [][]event.Event{events[:50], events[50:]} {
				results, err := sink.Publish(context.Background(), batch)
				if err != nil {
					t.Fatal(err)
				}
				if want := slices.Repeat([]Outcome{Delivered}, len(batch)); !slices.Equal(outcomes(results), want) {
					t.Fatalf("outcomes %v, want all %d delivered", outcomes(results), len(batch))
				}
			}

			sent := map[string]event.Event{}
			for _, e := range events {
				sent[e.ID()] = e
			}
			// Per key (action), the records come back in the order they were sent, all
			// from one partition.
			byKey := map[string][]string{}
			partition := map[string]int32{}
			for _, r := range consume(t, cluster.ListenAddrs(), len(events)) {
				e := decodeRecord(t, r)
				want, ok := sent[e.ID()]
				if !ok {
					t.Fatalf("unexpected record %s", e.ID())
				}
				if string(r.Key) != want.Extensions()[ExtPartitionKey] {
					t.Errorf("record %s has key %q", e.ID(), r.Key)
				}
				if p, seen := partition[string(r.Key)]; seen && p != r.Partition {
					t.Errorf("key %s in partitions %d and %d", r.Key, p, r.Partition)
				}
				partition[string(r.Key)] = r.Partition
				byKey[string(r.Key)] = append(byKey[string(r.Key)], e.ID())
				if e.Type() != want.Type() || e.Source() != want.Source() || e.Subject() != want.Subject() ||
					!e.Time().Equal(want.Time()) || string(e.Data()) != string(want.Data()) || attempt(t, e) != 1 {
					t.Errorf("read %v\nsent %v", e, want)
				}
				if mode == Binary && (header(r, "content-type") != event.ApplicationJSON || header(r, "ce_flyteaction") == "") {
					t.Errorf("binary mode record headers %v", r.Headers)
				}
			}
			for _, e := range events {
				k := e.Extensions()[ExtPartitionKey].(string)
				if got := byKey[k][0]; got != e.ID() {
					t.Fatalf("key %s: read %s where %s was sent", k, got, e.ID())
				}
				byKey[k] = byKey[k][1:]
			}
			if len(partition) < 2 {
				t.Errorf("%d actions all went to one partition", len(partition))
			}
		})
	}
}

func TestKafkaRejectsTooLarge(t *testing.T) {
	cluster := startKafka(t, 0, "")
	sink := openSink(t, kafkaSpec(cluster, "", ""))
	events := cloudEvents(t, 3, 3)
	batch := []event.Event{events[0], withData(t, events[1], 2<<20), events[2]}
	results, err := sink.Publish(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Outcome{Delivered, Reject, Delivered}; !slices.Equal(outcomes(results), want) {
		t.Fatalf("outcomes %v, want %v", results, want)
	}
	if !strings.Contains(results[1].Detail, "MESSAGE_TOO_LARGE") {
		t.Errorf("detail %q", results[1].Detail)
	}
	got := consume(t, cluster.ListenAddrs(), 2)
	var gotIDs []string
	for _, r := range got {
		gotIDs = append(gotIDs, header(r, "ce_id"))
	}
	slices.Sort(gotIDs)
	if want := []string{events[0].ID(), events[2].ID()}; !slices.Equal(gotIDs, want) {
		t.Errorf("the topic holds %v, want %v", gotIDs, want)
	}
}

// The broker goes away: Publish reports Retry within a few seconds; the broker comes
// back (same address, same data): the events are delivered, each action's in order.
func TestKafkaBrokerOutage(t *testing.T) {
	dataDir := t.TempDir()
	cluster := startKafka(t, 0, dataDir)
	addr := cluster.ListenAddrs()[0]
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	sink := openSink(t, kafkaSpec(cluster, "", "1s"))
	events := cloudEvents(t, 20, 4)
	if results, err := sink.Publish(context.Background(), events[:5]); err != nil || len(results) != 5 || results[4].Outcome != Delivered {
		t.Fatalf("before the outage: %v, %v", results, err)
	}

	cluster.Close()
	start := time.Now()
	results, err := sink.Publish(context.Background(), events[5:])
	if err != nil {
		t.Fatal(err)
	}
	if len(results) == 0 || results[len(results)-1].Outcome != Retry || slices.Contains(outcomes(results), Reject) {
		t.Fatalf("while the broker is down: %v, want a prefix ending in Retry", results)
	}
	took := time.Since(start)
	t.Logf("down: %d delivered, then Retry (%s) after %s", len(results)-1, results[len(results)-1].Detail, took)
	if took > 10*time.Second {
		t.Errorf("Retry took %s with timeout=1s", took)
	}
	next := 5 + len(results) - 1

	cluster = startKafka(t, port, dataDir)
	deadline := time.Now().Add(30 * time.Second)
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

	// Every event is there; a record the broker stored while its acknowledgement was
	// lost may be there twice (at least once). Each action's events first appear in
	// the order they were sent.
	seen := map[string]bool{}
	byKey := map[string][]string{}
	records := 0
	consumeUntil(t, cluster.ListenAddrs(), func(r *kgo.Record) bool {
		records++
		id := header(r, "ce_id")
		if !seen[id] {
			seen[id] = true
			byKey[string(r.Key)] = append(byKey[string(r.Key)], id)
		}
		return len(seen) == len(events)
	})
	for _, e := range events {
		k := e.Extensions()[ExtPartitionKey].(string)
		if len(byKey[k]) == 0 || byKey[k][0] != e.ID() {
			t.Fatalf("key %s: read %v where %s was sent next", k, byKey[k], e.ID())
		}
		byKey[k] = byKey[k][1:]
	}
	t.Logf("%d records read for %d events", records, len(events))
}
