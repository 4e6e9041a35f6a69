package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events/cloudevents"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/repo"
)

// history is two actions as the events service would hold them: flaky with a retry,
// sleep straight through.
func history() []heldAction {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ev := func(run string, attempt uint32, phase flytecorev1.ActionPhase, version uint32) *eventsv1.ActionEvent {
		at = at.Add(time.Second)
		return &eventsv1.ActionEvent{
			Id:      &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: run, Action: run},
			Attempt: attempt, Phase: phase, Version: version, OccurredAt: timestamppb.New(at), Cluster: egressCluster,
			Reason: "Because",
		}
	}
	const (
		queued    = flytecorev1.ActionPhase_ACTION_PHASE_QUEUED
		running   = flytecorev1.ActionPhase_ACTION_PHASE_RUNNING
		failed    = flytecorev1.ActionPhase_ACTION_PHASE_FAILED
		succeeded = flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED
	)
	return []heldAction{
		{key: "demo/development/flaky/flaky", terminal: true, events: []*eventsv1.ActionEvent{
			ev("flaky", 1, queued, 0), ev("flaky", 1, running, 0), ev("flaky", 1, running, 1), ev("flaky", 1, failed, 0),
			ev("flaky", 2, queued, 0), ev("flaky", 2, running, 0), ev("flaky", 2, succeeded, 0),
		}},
		{key: "demo/development/sleep/sleep", terminal: true, events: []*eventsv1.ActionEvent{
			ev("sleep", 1, queued, 0), ev("sleep", 1, running, 0), ev("sleep", 1, succeeded, 0),
		}},
	}
}

// delivered is what a faithful sink delivers of held: each action's events in order,
// the actions interleaved.
func delivered(t *testing.T, held []heldAction) []event.Event {
	t.Helper()
	var out []event.Event
	for i := 0; ; i++ {
		more := false
		for _, h := range held {
			if i < len(h.events) {
				more = true
				ce, err := cloudevents.Convert(h.events[i], egressCluster)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, ce)
			}
		}
		if !more {
			return out
		}
	}
}

// TestEgressVerdict: the verdict passes a faithful delivery and names the action of every
// way a sink can fall short.
func TestEgressVerdict(t *testing.T) {
	tests := []struct {
		name    string
		change  func(got []event.Event) []event.Event
		refused []string
		want    []string // in the problems; none: it passes
	}{
		{name: "every event once, in order", change: func(got []event.Event) []event.Event { return got }},
		{name: "one missing", change: func(got []event.Event) []event.Event { return slices.Delete(got, 4, 5) },
			want: []string{"demo/development/flaky/flaky: 1 of its 7 events missing: demo/development/flaky/flaky/1/running/1"}},
		{name: "one twice", change: func(got []event.Event) []event.Event { return append(got, got[0]) },
			want: []string{"demo/development/flaky/flaky/1/queued/0 arrived 2 times"}},
		{name: "two swapped", change: func(got []event.Event) []event.Event { got[2], got[4] = got[4], got[2]; return got },
			want: []string{"demo/development/flaky/flaky: out of order: demo/development/flaky/flaky/1/running/0 arrived after demo/development/flaky/flaky/1/running/1"}},
		{name: "one the service does not hold", change: func(got []event.Event) []event.Event {
			e := got[0].Clone()
			e.SetID("demo/development/other/other/1/queued/0")
			return append(got, e)
		}, want: []string{"got demo/development/other/other/1/queued/0, which the events service does not hold"}},
		{name: "other data", change: func(got []event.Event) []event.Event {
			e := got[1].Clone()
			_ = e.SetData(event.ApplicationJSON, []byte(`{"attempt":1}`))
			got[1] = e
			return got
		}, want: []string{"demo/development/sleep/sleep: demo/development/sleep/sleep/1/queued/0 arrived with data other than the stored event"}},
		{name: "another source", change: func(got []event.Event) []event.Event {
			e := got[0].Clone()
			e.SetSource("flyte://elsewhere/demo/development")
			got[0] = e
			return got
		}, want: []string{`arrived with source "flyte://elsewhere/demo/development" (want "flyte://sandbox/demo/development")`}},
		{name: "no CloudEvent", change: func(got []event.Event) []event.Event { return got }, refused: []string{"a request that is no CloudEvent: EOF"},
			want: []string{"got a request that is no CloudEvent: EOF"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held := history()
			summary, problems := verdict("http", held, tt.change(delivered(t, held)), tt.refused, egressCluster)
			if len(tt.want) == 0 {
				if want := "cloudevents: http got 10 events of 2 actions, in order, none missing"; summary != want || len(problems) > 0 {
					t.Fatalf("verdict %q, problems %q; want %q", summary, problems, want)
				}
				return
			}
			if summary != "" {
				t.Errorf("verdict %q; want it to fail", summary)
			}
			for _, w := range tt.want {
				if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, w) }) {
					t.Errorf("problems %q lack %q", problems, w)
				}
			}
		})
	}
}

// TestEgressConsumers: the sandbox's NATS server, stream, subscriber and HTTP receiver
// take what the events service's own sinks publish, and the verdict passes it; each
// event is logged as a JSON line.
func TestEgressConsumers(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "nats-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	free, err := ports.Free(2)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Dir: t.TempDir(), NATSPort: free[0], CloudEventsReceiverPort: free[1]}
	logs := filepath.Join(o.Dir, "logs")
	if err := os.Mkdir(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	e, err := startEgress(ctx, o, bin, logs, &stops)
	if err != nil {
		t.Fatal(err)
	}

	held := history()
	events := delivered(t, held)
	flags := e.sinkFlags()
	i := slices.Index(flags, "--cloudevents-config")
	if i < 0 || i+1 == len(flags) {
		t.Fatalf("flags %q name no sinks file", flags)
	}
	sinks, err := cloudevents.Load(flags[i+1])
	if err != nil {
		t.Fatal(err)
	}
	if len(sinks) != 2 {
		t.Fatalf("%d sinks in %s, want the NATS and the HTTP one", len(sinks), flags[i+1])
	}
	for _, cfg := range sinks {
		sink, err := cfg.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		results, err := sink.Publish(ctx, events)
		_ = sink.Close()
		if err != nil || len(results) != len(events) || slices.ContainsFunc(results, func(r cloudevents.Result) bool { return r.Outcome != cloudevents.Delivered }) {
			t.Fatalf("%s: published %v, %v", cfg.Name(), results, err)
		}
	}
	for _, s := range []*sinkLog{e.nats, e.http} {
		var summary string
		var problems []string
		for range 50 { // the subscriber reads asynchronously
			got, refused := s.events()
			if summary, problems = verdict(s.name, held, got, refused, egressCluster); summary != "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if want := "cloudevents: " + s.name + " got 10 events of 2 actions, in order, none missing"; summary != want {
			t.Errorf("%s: verdict %q, problems %q; want %q", s.name, summary, problems, want)
		}
		f, err := os.Open(s.path)
		if err != nil {
			t.Fatal(err)
		}
		lines := 0
		for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
			var logged event.Event
			if err := json.Unmarshal(sc.Bytes(), &logged); err != nil || lines >= len(events) || logged.ID() != events[lines].ID() {
				t.Errorf("%s line %d: %v: %s", s.path, lines+1, err, sc.Bytes())
				break
			}
		}
		_ = f.Close()
		if lines != len(events) {
			t.Errorf("%s holds %d lines, want %d", s.path, lines, len(events))
		}
	}
}
