// Package cloudevents publishes action events as CloudEvents 1.0 to the sinks an
// operator configures: HTTP receivers, NATS JetStream subjects and Kafka topics. It
// converts (Convert), configures (Load: a YAML file, a block per sink, see File;
// SinkSpec.Config: one such block; Parse: --cloudevents-sink's URL) and sends (Sink.Publish); reading the outbox, cursors, dead letters
// and retry timing belong to the relay.
//
// # The event
//
// Convert maps an ActionEvent to: id <project>/<domain>/<run>/<action>/<attempt>/<phase>/<version>
// (stable across redelivery), source flyte://<cluster>/<project>/<domain> (the event's
// own cluster, else the configured one), type org.flyte.action.<phase>.v1, subject
// <run>/<action>, time = occurred_at, datacontenttype application/json and data the
// event in protojson (camelCase names, the contract's JSON mapping, zero values
// omitted). Extensions: flyteproject, flytedomain, flyterun, flyteaction, flyteattempt
// (an Integer), flytephase, and partitionkey (<project>/<domain>/<run>/<action>, the
// CloudEvents Partitioning extension, which the Kafka binding maps to the record key).
//
// # Modes and headers
//
//   - HTTP uses the SDK's HTTP binding (protocol/http WriteRequest): binary mode (the
//     default) puts attributes in ce-* headers and the JSON data in the body with
//     Content-Type application/json; structured mode sends application/cloudevents+json;
//     batched mode (mode: batch) sends up to batchSize events as one JSON array,
//     application/cloudevents-batch+json, the body the SDK's NewHTTPRequestFromEvents
//     writes and its NewEventsFromHTTPRequest reads.
//   - Kafka follows the Kafka protocol binding: binary mode (the default) with ce_*
//     headers and content-type, or structured mode; the record key is partitionkey.
//     The SDK's Kafka protocol modules (sarama, confluent) are not used: franz-go's kgo
//     writes the records, through the SDK's binding.Write and a small writer here.
//   - NATS is structured mode only: the body is application/cloudevents+json (with a
//     Content-Type header). The SDK's NATS binding is structured too, so any CloudEvents
//     NATS consumer reads it, and a JetStream consumer needs nothing but the body.
//
// # Order, duplicates and outcomes
//
// Publish sends a batch in order and reports results for a prefix: it stops after the
// first Retry, so the caller resends from there and an action's events are never sent
// out of order by this package; a Reject does not stop it. Delivery is at least once;
// the CloudEvent id (with source) identifies a duplicate.
//
//   - HTTP: one request at a time over a keep-alive connection (HTTP/2 over TLS when
//     the receiver offers it), each bounded by the timeout. 2xx is Delivered. 429, 408,
//     5xx, network errors and timeouts are Retry; so are redirects, which are not
//     followed (the receiver's address is to be fixed, and an event would otherwise
//     carry the bearer token wherever it points). Any other 4xx is Reject with detail
//     "HTTP <status>: <excerpt>", the excerpt at most 256 bytes of the body's start
//     with the sink's secrets replaced by REDACTED (its token, its URL's query values,
//     path and longer path segments), since a receiver may echo the request. The
//     body read is bounded. In
//     batched mode a response answers the whole batch; a batch rejected is sent again
//     an event per request, so that only the refused events are rejected.
//   - NATS JetStream: asynchronous publishes, at most 256 awaiting acknowledgements,
//     read back in order. Nats-Msg-Id is "<source> <id>", so the stream's duplicate
//     window drops a resent copy (the CloudEvent id alone could repeat across clusters
//     sharing a stream). No responders (no stream for the subject, or none available),
//     timeouts and a lost connection are Retry; a message larger than the server's max
//     payload or the stream's max message size is Reject. The client does not retry by
//     itself (a message it retried would be stored behind the ones published after
//     it); the caller resends from the first Retry, and what the stream had already
//     stored is dropped as a duplicate. Only a message the server refused for a
//     moment while taking the next could land behind it. The sink does not create
//     streams.
//   - Kafka: the batch is produced at once with the idempotent producer (franz-go's
//     default), whose own retries keep each partition's order without duplicates. A
//     record not acknowledged within the timeout fails, with everything behind it in its
//     partition, as Retry — even one in flight when its broker died (otherwise franz-go
//     would wait for that answer indefinitely), so Publish returns within a few seconds
//     of the timeout during an outage, and a resend of a record the broker had in fact
//     stored stores it twice (same ce_id). Records of a batch behind a Retry may have
//     been written already and are written again too. MessageTooLarge,
//     RecordListTooLarge, InvalidRecord and InvalidTimestamp are Reject; everything
//     else (broker down, missing topic, authorization) is Retry. A topic whose
//     max.message.bytes is below the producer's batch size (1 MB) makes the broker
//     refuse a whole batch as too large, so leave it at Kafka's default or above.
//
// Open never waits for the receiver: a broker that is down when the service starts
// makes Publish report Retry until it is up.
//
// The tests run real components in process: httptest servers over HTTP/1.1 and HTTP/2,
// an embedded nats-server with JetStream, and franz-go's kfake, a Kafka-protocol broker
// written in Go. A real Kafka broker cannot run on the build machine (no JVM, no
// containers), so kfake stands in for it.
package cloudevents
