package cloudevents

import (
	"context"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/flytekube/backend/internal/textbound"
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
	// Detail says why for Retry and Reject: the HTTP status and at most MaxExcerpt
	// bytes of the body, or the broker's error. It is at most MaxDetail bytes of valid
	// UTF-8 without NUL (it goes into a text column) and never holds the sink's
	// credentials: a receiver may echo the request, token and URL included.
	Detail string
}

const (
	// MaxDetail bounds Result.Detail in bytes.
	MaxDetail = 1024
	// MaxExcerpt bounds the excerpt of a receiver's answer in Result.Detail, in bytes.
	MaxExcerpt = 256
	// minPartialSecret is the shortest start of a secret removed from the end of a
	// text that was cut there: shorter ones are more often words than secrets.
	minPartialSecret = 4
)

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
func boundDetail(s string) string { return textbound.Fit(s, MaxDetail) }

// secrets are the strings a sink's details must not show: its token and what of its
// URL may be a credential (urlSecrets).
type secrets []string

// redact replaces every occurrence of a secret in text with REDACTED, overlapping ones
// as one. cut says text is the start of something longer: a secret's start at its end
// (the rest cut off) is replaced too.
func (s secrets) redact(text string, cut bool) string {
	hidden := make([]bool, len(text))
	hide := func(from, to int) {
		for i := from; i < to; i++ {
			hidden[i] = true
		}
	}
	for _, secret := range s {
		if secret == "" {
			continue
		}
		for i := 0; ; {
			j := strings.Index(text[i:], secret)
			if j < 0 {
				break
			}
			hide(i+j, i+j+len(secret))
			i += j + 1
		}
		if cut {
			if n := partialSuffix(text, secret); n >= minPartialSecret {
				hide(len(text)-n, len(text))
			}
		}
	}
	var b strings.Builder
	for i := 0; i < len(text); i++ {
		switch {
		case !hidden[i]:
			b.WriteByte(text[i])
		case i == 0 || !hidden[i-1]:
			b.WriteString(redacted)
		}
	}
	return b.String()
}

// partialSuffix is the length of the longest end of text that is a proper start of
// secret.
func partialSuffix(text, secret string) int {
	for i := max(0, len(text)-len(secret)+1); i < len(text); i++ {
		if strings.HasPrefix(secret, text[i:]) {
			return len(text) - i
		}
	}
	return 0
}

// excerpt is what a detail shows of a receiver's answer: head, the body's first bytes
// (more says the body went on), with s's secrets replaced, as at most MaxExcerpt
// bytes of valid UTF-8. It is redacted before it is cut, so that no cut leaves half a
// secret behind.
func excerpt(head []byte, more bool, s secrets) string {
	return textbound.Fit(s.redact(string(head), more), MaxExcerpt)
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
