package cloudevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsInFlight bounds the publishes awaiting JetStream's acknowledgement.
const natsInFlight = 256

// natsSink publishes to a JetStream subject: asynchronously, up to natsInFlight awaiting
// their acknowledgements, which are read back in order.
type natsSink struct {
	name    string
	subject string
	stream  string
	timeout time.Duration
	nc      *nats.Conn
	js      jetstream.JetStream

	mu sync.Mutex // one Publish at a time
}

func openNATS(_ context.Context, c Config) (*natsSink, error) {
	opts := []nats.Option{
		nats.Name("flyte-events cloudevents " + c.name),
		nats.Timeout(c.timeout),
		// The broker may be down when the service starts or at any time after:
		// reconnect forever, and while disconnected fail publishes at once (no
		// reconnect buffer) so that they are reported as Retry rather than held.
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectBufSize(-1),
	}
	if c.caFile != "" {
		tlsConf, err := tlsConfig(c.caFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tlsConf))
	}
	if c.tokenFile != "" {
		if _, err := readToken(c.tokenFile); err != nil {
			return nil, err
		}
		file := c.tokenFile
		// Read on each (re)connection, so a rotated token is picked up.
		opts = append(opts, nats.TokenHandler(func() string {
			tok, _ := readToken(file)
			return tok
		}))
	}
	urls := make([]string, len(c.servers))
	for i, s := range c.servers {
		urls[i] = "nats://" + s
	}
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS: %w", err)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncTimeout(c.timeout),
		jetstream.WithPublishAsyncMaxPending(natsInFlight),
	)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("JetStream: %w", err)
	}
	return &natsSink{name: c.name, subject: c.subject, stream: c.stream, timeout: c.timeout, nc: nc, js: js}, nil
}

func (s *natsSink) Name() string { return s.name }

// String keeps %v from printing the fields (an HTTP receiver's query among them).
func (s *natsSink) String() string { return "cloudevents sink " + s.name }

func (s *natsSink) Close() error {
	s.nc.Close()
	return nil
}

// MsgID is the Nats-Msg-Id header of an event: its source and id, which together are
// the event's identity (the id alone may repeat across clusters sharing a stream).
// JetStream drops a message whose Nats-Msg-Id it stored within the stream's duplicate
// window, so a re-send after a lost acknowledgement is stored once.
func MsgID(ev *event.Event) string { return ev.Source() + " " + ev.ID() }

func (s *natsSink) Publish(ctx context.Context, events []event.Event) ([]Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	type inflight struct {
		i   int
		ack jetstream.PubAckFuture
	}
	outcomes := make([]Result, len(events))
	var window []inflight
	// settleOldest waits for the oldest publish's acknowledgement; it reports whether
	// that was a Retry, after which nothing more is sent.
	settleOldest := func() (bool, error) {
		p := window[0]
		window = window[1:]
		select {
		case <-p.ack.Ok():
			outcomes[p.i] = delivered()
		case err := <-p.ack.Err():
			outcomes[p.i] = classifyNATS(err)
		case <-ctx.Done():
			return true, ctx.Err()
		}
		return outcomes[p.i].Outcome == Retry, nil
	}

	opts := []jetstream.PublishOpt{
		// No retry inside the client: a retried message would be stored after the
		// ones sent behind it. A Retry goes back to the caller, which resends in order.
		jetstream.WithRetryAttempts(0),
	}
	if s.stream != "" {
		opts = append(opts, jetstream.WithExpectStream(s.stream))
	}
send:
	for i := range events {
		if len(window) == natsInFlight {
			stop, err := settleOldest()
			if err != nil {
				return prefix(outcomes), err
			}
			if stop {
				break send
			}
		}
		// The event encodes itself as the JSON format has it; format.JSON.Marshal would
		// encode it the same way and then check and compact the result again.
		body, err := events[i].MarshalJSON()
		if err != nil {
			outcomes[i] = reject(fmt.Sprintf("encoding the event: %v", err))
			continue
		}
		msg := nats.NewMsg(s.subject)
		msg.Header.Set("Content-Type", event.ApplicationCloudEventsJSON)
		msg.Data = body
		ack, err := s.js.PublishMsgAsync(msg, append(opts[:len(opts):len(opts)], jetstream.WithMsgID(MsgID(&events[i])))...)
		if err != nil {
			outcomes[i] = classifyNATS(err)
			if errors.Is(err, nats.ErrMaxPayload) {
				outcomes[i] = reject(fmt.Sprintf("%v: the message is %d bytes, the server takes %d", err, len(body), s.nc.MaxPayload()))
			}
			if outcomes[i].Outcome == Retry {
				break
			}
			continue
		}
		window = append(window, inflight{i: i, ack: ack})
	}
	for len(window) > 0 {
		stop, err := settleOldest()
		if err != nil {
			return prefix(outcomes), err
		}
		if stop {
			break
		}
	}
	return prefix(outcomes), nil
}

// classifyNATS tells a message the broker refuses for good (larger than the server's or
// the stream's limit) from everything else, which may pass later: no responders (no
// stream, or its leader is being elected), timeouts, a lost connection, a stream that
// is full or not the expected one (a configuration for the operator to fix, not a
// reason to dead-letter every event).
func classifyNATS(err error) Result {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return reject(err.Error())
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return reject(err.Error())
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return retry(err.Error() + " (no stream stores the subject, or it is unavailable)")
	}
	return retry(err.Error())
}
