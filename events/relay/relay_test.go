package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/outbox"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/test/eventually"
)

func jsonData(data []byte, m proto.Message) error {
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, m)
}

// Sixteen writers record their actions' events, each action's in order over several
// Records, and every Record is delivered twice (as an executor redelivers after a
// restart): each sink gets every event once, each action's in order.
func TestEveryEventOnceAndInOrderPerAction(t *testing.T) {
	d := newDB(t)
	one, two := newReceiver(t), newReceiver(t)
	startRelay(t, d, one.sink(t, "one", ""), two.sink(t, "two", ""))
	registered(t, d, "one", "two")

	const writers, actions = 16, 5
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for a := range actions {
				evs := actionEvents(fmt.Sprintf("run-%d", w), fmt.Sprintf("a%d", a))
				for _, batch := range [][]int{{0, 1}, {2}, {3}} {
					part := evs[batch[0] : batch[len(batch)-1]+1]
					d.record(t, part...)
					d.record(t, part...) // a redelivery: absorbed, and not published again
				}
			}
		})
	}
	wg.Wait()
	want := writers * actions * len(lifecycle)
	for name, rc := range map[string]*receiver{"one": one, "two": two} {
		eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) >= want },
			func() string { return fmt.Sprintf("sink %s accepted %d of %d events", name, len(rc.got()), want) })
		inOrderOnce(t, rc.got(), want)
	}
}

// A sink down for a while (503) loses nothing and keeps each action's order, while
// another sink goes on meanwhile.
func TestASinkDownForAWhileLosesNothing(t *testing.T) {
	d := newDB(t)
	down, up := newReceiver(t), newReceiver(t)
	var unavailable atomic.Bool
	unavailable.Store(true)
	down.setAnswer(func(received) int {
		if unavailable.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	r := startRelay(t, d, down.sink(t, "down", ""), up.sink(t, "up", ""))
	registered(t, d, "down", "up")
	const actions = 20
	for a := range actions {
		d.record(t, actionEvents("outage", fmt.Sprintf("a%d", a))...)
	}
	want := actions * len(lifecycle)
	eventually.True(t, 30*time.Second, func() bool { return len(up.got()) == want },
		func() string {
			return fmt.Sprintf("the working sink accepted %d of %d during the other's outage", len(up.got()), want)
		})
	eventually.True(t, 30*time.Second, func() bool { return r.counter(t, "flyte_events_cloudevents_retries_total", "down") >= 3 },
		func() string { return "the sink that is down was not retried" })
	if n := len(down.got()); n != 0 {
		t.Fatalf("the sink that is down accepted %d", n)
	}
	unavailable.Store(false)
	eventually.True(t, 30*time.Second, func() bool { return len(down.got()) >= want },
		func() string {
			return fmt.Sprintf("after the outage the sink accepted %d of %d", len(down.got()), want)
		})
	inOrderOnce(t, down.got(), want)
	inOrderOnce(t, up.got(), want)
}

// An event the sink refuses for good (400) becomes a dead letter with the sink's answer,
// the events after it go on, and a replay once the sink takes it delivers it. In
// batched mode the refused batch is sent again an event per request, so only the poison
// is dead-lettered.
func TestAPoisonEventGoesToTheDeadLettersAndIsReplayed(t *testing.T) {
	for _, mode := range []cloudevents.Mode{cloudevents.Binary, cloudevents.Batched} {
		t.Run(string(mode), func(t *testing.T) {
			d := newDB(t)
			rc := newReceiver(t)
			var refuse atomic.Bool
			refuse.Store(true)
			rc.setAnswer(func(r received) int {
				if r.action == "poison" && r.version == 1 && refuse.Load() {
					return http.StatusBadRequest
				}
				return http.StatusOK
			})
			r := startRelay(t, d, rc.sink(t, "http", mode))
			registered(t, d, "http")
			d.record(t, actionEvents("poisoned", "poison")...)
			d.record(t, actionEvents("poisoned", "healthy")...)
			want := 2*len(lifecycle) - 1
			eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) == want },
				func() string { return fmt.Sprintf("accepted %d of the %d events the sink takes", len(rc.got()), want) })
			// The receiver has the last event before the relay, back from the same
			// Publish, writes the dead letter.
			ctx := context.Background()
			var letters []outbox.DeadLetter
			eventually.True(t, 10*time.Second, func() bool {
				var err error
				letters, _, err = d.outbox.ListDeadLetters(ctx, outbox.DeadLetterFilter{Sink: "http", PageSize: 10})
				return err == nil && len(letters) > 0
			}, func() string { return "no dead letter was written" })
			if len(letters) != 1 || letters[0].Entry.Key.Action != "poison" || letters[0].Entry.Version != 1 || !strings.HasPrefix(letters[0].Detail, "HTTP 400") {
				t.Fatalf("dead letters: %+v; want poison's version 1, refused with HTTP 400", letters)
			}
			if n := r.counter(t, "flyte_events_cloudevents_dead_letters_total", "http"); n != 1 {
				t.Errorf("dead letters counted: %v", n)
			}

			refuse.Store(false)
			if n, err := d.outbox.RequestReplay(ctx, "http", nil); err != nil || n != 1 {
				t.Fatalf("RequestReplay: %d, %v", n, err)
			}
			eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) == want+1 },
				func() string { return "the replayed dead letter was not delivered" })
			eventually.True(t, 10*time.Second, func() bool {
				letters, _, err := d.outbox.ListDeadLetters(ctx, outbox.DeadLetterFilter{Sink: "http", PageSize: 10})
				return err == nil && len(letters) == 0
			}, func() string { return "the replayed dead letter is still kept" })
		})
	}
}

// A relay stopped while a sink holds a request (as when the service is killed) has not
// moved its cursor: the next relay sends the same event again, with the same id.

func TestARelayStoppedMidPublishSendsItAgainWithTheSameID(t *testing.T) {
	d := newDB(t)
	rc := newReceiver(t)
	held := make(chan struct{})
	release := make(chan struct{})
	var first atomic.Bool
	rc.setAnswer(func(received) int {
		if first.CompareAndSwap(false, true) {
			close(held)
			<-release
			return http.StatusServiceUnavailable // too late: the relay is gone
		}
		return http.StatusOK
	})
	r := startRelay(t, d, rc.sink(t, "http", ""))
	registered(t, d, "http")
	d.record(t, actionEvents("restarted", "a")...)
	<-held
	r.stop()
	close(release)
	startRelay(t, d, rc.sink(t, "http", ""))
	want := len(lifecycle)
	eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) == want },
		func() string { return fmt.Sprintf("after the restart %d of %d accepted", len(rc.got()), want) })
	inOrderOnce(t, rc.got(), want)
	rc.mu.Lock()
	seen := rc.seen
	rc.mu.Unlock()
	if seen != want+1 {
		t.Errorf("the receiver saw %d requests; want %d (the one held, sent again)", seen, want+1)
	}
}

// Two replicas: one relays; when it stops, the other takes over, and nothing is lost.
func TestOneReplicaRelaysAndAnotherTakesOver(t *testing.T) {
	d := newDB(t)
	rc := newReceiver(t)
	a := startRelay(t, d, rc.sink(t, "http", ""))
	b := startRelay(t, d, rc.sink(t, "http", ""))
	registered(t, d, "http")
	eventually.True(t, 10*time.Second, func() bool { return a.leading(t) != b.leading(t) },
		func() string { return fmt.Sprintf("leaders: a %v, b %v; want exactly one", a.leading(t), b.leading(t)) })
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		if a.leading(t) && b.leading(t) {
			t.Fatal("both replicas lead")
		}
	}
	leader, standby := a, b
	if b.leading(t) {
		leader, standby = b, a
	}
	d.record(t, actionEvents("failover", "before")...)
	eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) == len(lifecycle) },
		func() string { return "the leader did not relay" })
	leader.stop()
	eventually.True(t, 10*time.Second, func() bool { return standby.leading(t) },
		func() string { return "the standby never took over" })
	d.record(t, actionEvents("failover", "after")...)
	eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) == 2*len(lifecycle) },
		func() string {
			return fmt.Sprintf("after the take-over %d of %d accepted", len(rc.got()), 2*len(lifecycle))
		})
	inOrderOnce(t, rc.got(), 2*len(lifecycle))
}

// Each batch handed to a sink is a span: which sink, how many events, what became of
// them; never the sink's address.
func TestEachPublishIsASpan(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	d := newDB(t)
	rc := newReceiver(t)
	startRelay(t, d, rc.sink(t, "http", ""))
	registered(t, d, "http")
	d.record(t, actionEvents("traced", "a")...)
	eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) == len(lifecycle) },
		func() string { return "not delivered" })
	delivered := 0
	eventually.True(t, 10*time.Second, func() bool {
		delivered = 0
		for _, s := range spans.Ended() {
			if s.Name() != "cloudevents.publish" {
				continue
			}
			for _, a := range s.Attributes() {
				if strings.Contains(a.Value.Emit(), rc.URL) || strings.Contains(a.Value.Emit(), "127.0.0.1") {
					t.Errorf("a span names the sink's address: %s=%s", a.Key, a.Value.Emit())
				}
				if a.Key == "flyte.delivered" {
					delivered += int(a.Value.AsInt64())
				}
			}
		}
		return delivered == len(lifecycle)
	}, func() string {
		return fmt.Sprintf("spans count %d delivered events, want %d", delivered, len(lifecycle))
	})
}

// An event of a phase this release does not name (a newer executor's, stored by an older
// events replica) cannot be made a CloudEvent: its type and id carry the phase's name.
// It is kept as a dead letter, to replay once a release that knows the phase serves, and
// the action's other events are published in order.
func TestAPhaseThisReleaseDoesNotNameIsKeptAsADeadLetter(t *testing.T) {
	d := newDB(t)
	rc := newReceiver(t)
	startRelay(t, d, rc.sink(t, "http", ""))
	registered(t, d, "http")
	evs := actionEvents("newer", "a")
	evs[1].Phase = flytecorev1.ActionPhase(9) // in place of Initializing
	d.record(t, evs...)
	want := len(lifecycle) - 1
	eventually.True(t, 30*time.Second, func() bool { return len(rc.got()) == want },
		func() string {
			return fmt.Sprintf("published %d of the %d events with a known phase", len(rc.got()), want)
		})
	inOrderOnce(t, rc.got(), want)
	var letters []outbox.DeadLetter
	eventually.True(t, 10*time.Second, func() bool {
		var err error
		letters, _, err = d.outbox.ListDeadLetters(context.Background(), outbox.DeadLetterFilter{Sink: "http", PageSize: 10})
		return err == nil && len(letters) > 0
	}, func() string { return "no dead letter was written" })
	if len(letters) != 1 || letters[0].Entry.Version != 1 || letters[0].Entry.Phase != 9 || !strings.Contains(letters[0].Detail, "no known phase (9)") {
		t.Fatalf("dead letters: %+v; want version 1, of phase 9, kept for want of a name", letters)
	}
}
