package cloudevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaSink produces each batch to one topic with franz-go's idempotent producer, keyed
// by the action so that an action's events share a partition and keep their order.
type kafkaSink struct {
	name   string
	topic  string
	mode   Mode
	client *kgo.Client

	mu sync.Mutex // one Publish at a time
}

func openKafka(c Config) (*kafkaSink, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.servers...),
		kgo.DefaultProduceTopic(c.topic),
		kgo.ClientID("flyte-events-cloudevents"),
		kgo.DialTimeout(c.timeout),
		// A record waits at most this long; then it, and the records behind it in its
		// partition, fail and are reported as Retry.
		kgo.RecordDeliveryTimeout(c.timeout),
		// Even when a request was written but never answered (the broker died with it
		// in flight). Without this, franz-go waits for that answer, forever if the
		// broker does not come back, and Publish would hang. The price: a resent
		// record the broker had in fact stored is stored twice. The relay resends
		// anyway (at least once), and consumers tell copies by ce_id.
		kgo.AllowIdempotentProduceCancellation(),
		// Learn of a dead broker sooner than the default 5s allows (the failing batch
		// is only timed out after a metadata refresh), so that an outage turns into a
		// Retry about when timeout= says.
		kgo.MetadataMinAge(time.Second),
		// A missing topic is retried like an unreachable broker (the default gives up
		// after 4 metadata loads, which would be a Retry all the same).
		kgo.UnknownTopicRetries(-1),
	}
	if c.caFile != "" {
		tlsConf, err := tlsConfig(c.caFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tlsConf))
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("Kafka client: %w", err)
	}
	return &kafkaSink{name: c.name, topic: c.topic, mode: c.mode, client: client}, nil
}

func (s *kafkaSink) Name() string { return s.name }

// String keeps %v from printing the fields (an HTTP receiver's query among them).
func (s *kafkaSink) String() string { return "cloudevents sink " + s.name }

func (s *kafkaSink) Close() error {
	s.client.Close()
	return nil
}

func (s *kafkaSink) Publish(ctx context.Context, events []event.Event) ([]Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	outcomes := make([]Result, len(events))
	index := make(map[*kgo.Record]int, len(events))
	records := make([]*kgo.Record, 0, len(events))
	for i := range events {
		rec, err := s.record(ctx, &events[i])
		if err != nil {
			outcomes[i] = reject(fmt.Sprintf("encoding the event: %v", err))
			continue
		}
		index[rec] = i
		records = append(records, rec)
	}
	if len(records) > 0 {
		for _, r := range s.client.ProduceSync(ctx, records...) {
			if r.Err == nil {
				outcomes[index[r.Record]] = delivered()
			} else {
				outcomes[index[r.Record]] = classifyKafka(r.Err)
			}
		}
	}
	results := prefix(outcomes)
	if err := ctx.Err(); err != nil && len(results) > 0 && results[len(results)-1].Outcome == Retry {
		return results[:len(results)-1], err
	}
	return results, nil
}

// record encodes ev per the Kafka protocol binding: key from the partitionkey
// extension; binary mode with ce_ headers and content-type, or structured mode.
func (s *kafkaSink) record(ctx context.Context, ev *event.Event) (*kgo.Record, error) {
	rec := &kgo.Record{Topic: s.topic}
	if k, ok := ev.Extensions()[ExtPartitionKey]; ok {
		key, err := types.ToString(k)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ExtPartitionKey, err)
		}
		rec.Key = []byte(key)
	}
	encode := binding.WithForceBinary(ctx)
	if s.mode == Structured {
		encode = binding.WithForceStructured(ctx)
	}
	w := (*kafkaRecordWriter)(rec)
	if _, err := binding.Write(encode, binding.ToMessage(ev), w, w); err != nil {
		return nil, err
	}
	return rec, nil
}

// classifyKafka tells a record the broker refuses for good from everything else (a
// broker down, a missing topic, a timeout, authorization), which may pass later and
// must not send every event to the dead letters.
func classifyKafka(err error) Result {
	switch {
	case errors.Is(err, kerr.MessageTooLarge),
		errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.InvalidTimestamp):
		return reject(err.Error())
	}
	return retry(err.Error())
}

// kafkaRecordWriter fills a record the way the CloudEvents Kafka protocol binding does:
// attributes in ce_<name> headers, datacontenttype in content-type, data as the value
// (binary mode); or content-type application/cloudevents+json and the whole event as
// the value (structured mode).
type kafkaRecordWriter kgo.Record

const (
	kafkaHeaderPrefix  = "ce_"
	kafkaContentHeader = "content-type"
)

var (
	_ binding.StructuredWriter = (*kafkaRecordWriter)(nil)
	_ binding.BinaryWriter     = (*kafkaRecordWriter)(nil)
)

func (w *kafkaRecordWriter) SetStructuredEvent(_ context.Context, f format.Format, ev io.Reader) error {
	w.Headers = append(w.Headers, kgo.RecordHeader{Key: kafkaContentHeader, Value: []byte(f.MediaType())})
	return w.SetData(ev)
}

func (w *kafkaRecordWriter) Start(context.Context) error { return nil }

func (w *kafkaRecordWriter) End(context.Context) error { return nil }

func (w *kafkaRecordWriter) SetData(data io.Reader) error {
	b, err := io.ReadAll(data)
	if err != nil {
		return err
	}
	w.Value = b
	return nil
}

func (w *kafkaRecordWriter) SetAttribute(attr spec.Attribute, value any) error {
	if value == nil {
		return nil
	}
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	name := kafkaHeaderPrefix + attr.Name()
	if attr.Kind() == spec.DataContentType {
		name = kafkaContentHeader
	}
	w.Headers = append(w.Headers, kgo.RecordHeader{Key: name, Value: []byte(s)})
	return nil
}

func (w *kafkaRecordWriter) SetExtension(name string, value any) error {
	if value == nil {
		return nil
	}
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	w.Headers = append(w.Headers, kgo.RecordHeader{Key: kafkaHeaderPrefix + name, Value: []byte(s)})
	return nil
}
