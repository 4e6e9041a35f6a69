package cloudevents

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Outcome is what became of one event a sink was asked to publish.
type Outcome int

const (
	// Delivered: the receiver or broker acknowledged the event.
	Delivered Outcome = iota + 1
	// Retry: a transient failure (network, timeout, 5xx, 429, broker unavailable). The
	// event and everything after it must be published again later.
	Retry
	// Reject: the receiver or broker refused this event for good (4xx other than 408 and
	// 429, a message larger than the broker takes). It belongs in the dead letters;
	// later events go on.
	Reject
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "delivered"
	case Retry:
		return "retry"
	case Reject:
		return "reject"
	}
	return "unknown"
}

// Result is the outcome of publishing one event.
type Result struct {
	Outcome Outcome
	// Detail says why for Retry and Reject: the HTTP status and the start of the body,
	// or the broker's error. It is at most MaxDetail bytes of valid UTF-8 without NUL
	// (it goes into a text column) and never holds a credential.
	Detail string
}

// MaxDetail bounds Result.Detail in bytes.
const MaxDetail = 1024

// Sink publishes CloudEvents to one receiver or broker.
type Sink interface {
	// Name is the sink's stable name, its cursor's key.
	Name() string
	// Publish sends events in the given order and reports a result for a prefix of
	// them, result i for events[i]: it stops after the first Retry (later events are
	// not attempted, so order holds). A Reject does not stop it. The error is for the
	// whole call, when ctx ended: the results then cover the events finished before.
	// Calls are serialized; a sink publishes one batch at a time.
	Publish(ctx context.Context, events []event.Event) ([]Result, error)
	// Close releases connections. Publish must not be called after it.
	Close() error
}

func delivered() Result { return Result{Outcome: Delivered} }

func retry(detail string) Result { return Result{Outcome: Retry, Detail: boundDetail(detail)} }

func reject(detail string) Result { return Result{Outcome: Reject, Detail: boundDetail(detail)} }

// boundDetail makes s fit Result.Detail: valid UTF-8 without NUL, at most MaxDetail
// bytes, cut at a rune boundary.
func boundDetail(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= MaxDetail {
		return s
	}
	cut := MaxDetail - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// prefix returns the results of a batch as Publish reports them: the events with an
// outcome, in order, up to and including the first Retry. An event without an outcome
// (zero Result: not attempted) ends the prefix.
func prefix(outcomes []Result) []Result {
	for i, r := range outcomes {
		switch r.Outcome {
		case Retry:
			return outcomes[:i+1]
		case Delivered, Reject:
		default:
			return outcomes[:i]
		}
	}
	return outcomes
}
