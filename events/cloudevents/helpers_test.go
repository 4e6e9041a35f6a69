package cloudevents

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)

// actionEvent is an event of action a<action> in run r1: its version-th change, in the
// running phase.
func actionEvent(action, version int) *eventsv1.ActionEvent {
	return &eventsv1.ActionEvent{
		Id: &flytecorev1.ActionIdentifier{
			Project: "flytesnacks", Domain: "development", Run: "r1", Action: fmt.Sprintf("a%d", action),
		},
		Attempt:    1,
		Phase:      flytecorev1.ActionPhase_ACTION_PHASE_RUNNING,
		Version:    uint32(version),
		OccurredAt: timestamppb.New(t0.Add(time.Duration(version) * time.Second)),
		Reason:     "Running",
		TaskType:   "container",
	}
}

// cloudEvents converts n events spread over actions actions: event i belongs to action
// i%actions, as its (i/actions)-th version, so each action's events are in order.
func cloudEvents(t testing.TB, n, actions int) []event.Event {
	t.Helper()
	out := make([]event.Event, n)
	for i := range out {
		e, err := Convert(actionEvent(i%actions, i/actions), "test")
		if err != nil {
			t.Fatal(err)
		}
		out[i] = e
	}
	return out
}

// withData replaces an event's data with a JSON string of size bytes.
func withData(t testing.TB, e event.Event, size int) event.Event {
	t.Helper()
	e = e.Clone()
	if err := e.SetData(event.ApplicationJSON, []byte(`"`+strings.Repeat("x", size)+`"`)); err != nil {
		t.Fatal(err)
	}
	return e
}

func ids(events []event.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID()
	}
	return out
}

func outcomes(results []Result) []Outcome {
	out := make([]Outcome, len(results))
	for i, r := range results {
		out[i] = r.Outcome
	}
	return out
}

// mustDecode decodes a configuration file of one sink, given as the YAML of its list
// item (sinksFile), that the test knows to be valid.
func mustDecode(t testing.TB, sink string) Config {
	t.Helper()
	sinks, err := Decode([]byte(sinksFile(sink)))
	if err != nil {
		t.Fatal(err)
	}
	if len(sinks) != 1 {
		t.Fatalf("%d sinks, want 1", len(sinks))
	}
	return sinks[0]
}

// mustParse parses a sink URL the test knows to be valid.
func mustParse(t testing.TB, raw string) Config {
	t.Helper()
	c, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
