package cloudevents

import (
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

func TestConvert(t *testing.T) {
	failed := actionEvent(3, 7)
	failed.Attempt = 2
	failed.Phase = flytecorev1.ActionPhase_ACTION_PHASE_FAILED
	failed.Cluster = "west-2"
	failed.Error = &flytecorev1.ExecutionError{Message: "exit 1"}

	tests := []struct {
		name                            string
		ev                              *eventsv1.ActionEvent
		id, source, typ, subject, phase string
		attempt                         int32
	}{
		{
			name: "configured cluster", ev: actionEvent(0, 0),
			id: "flytesnacks/development/r1/a0/1/running/0", source: "flyte://test/flytesnacks/development",
			typ: "org.flyte.action.running.v1", subject: "r1/a0", phase: "running", attempt: 1,
		},
		{
			name: "the event's own cluster", ev: failed,
			id: "flytesnacks/development/r1/a3/2/failed/7", source: "flyte://west-2/flytesnacks/development",
			typ: "org.flyte.action.failed.v1", subject: "r1/a3", phase: "failed", attempt: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Convert(tc.ev, "test")
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Validate(); err != nil {
				t.Fatalf("the SDK finds the event invalid: %v", err)
			}
			if e.SpecVersion() != event.CloudEventsVersionV1 {
				t.Errorf("specversion %q", e.SpecVersion())
			}
			for _, f := range []struct{ what, got, want string }{
				{"id", e.ID(), tc.id},
				{"source", e.Source(), tc.source},
				{"type", e.Type(), tc.typ},
				{"subject", e.Subject(), tc.subject},
				{"datacontenttype", e.DataContentType(), event.ApplicationJSON},
			} {
				if f.got != f.want {
					t.Errorf("%s = %q, want %q", f.what, f.got, f.want)
				}
			}
			if want := tc.ev.GetOccurredAt().AsTime(); !e.Time().Equal(want) {
				t.Errorf("time %v, want %v", e.Time(), want)
			}
			var data eventsv1.ActionEvent
			if err := protojson.Unmarshal(e.Data(), &data); err != nil {
				t.Fatalf("data is not the event in protojson: %v", err)
			}
			if !proto.Equal(&data, tc.ev) {
				t.Errorf("data decodes to %v, want %v", &data, tc.ev)
			}
			if !strings.Contains(string(e.Data()), `"occurredAt"`) {
				t.Errorf("data does not use camelCase names: %s", e.Data())
			}
			id := tc.ev.GetId()
			wantExt := map[string]any{
				ExtProject: id.GetProject(), ExtDomain: id.GetDomain(), ExtRun: id.GetRun(), ExtAction: id.GetAction(),
				ExtAttempt: tc.attempt, ExtPhase: tc.phase, ExtPartitionKey: key(id),
			}
			if len(e.Extensions()) != len(wantExt) {
				t.Errorf("extensions %v, want %v", e.Extensions(), wantExt)
			}
			for k, want := range wantExt {
				if got := e.Extensions()[k]; got != want {
					t.Errorf("extension %s = %#v, want %#v", k, got, want)
				}
			}

			// The structured JSON form reads back as the same event.
			b, err := format.JSON.Marshal(&e)
			if err != nil {
				t.Fatal(err)
			}
			var back event.Event
			if err := format.JSON.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back.ID() != e.ID() || back.Type() != e.Type() || string(back.Data()) != string(e.Data()) || back.Extensions()[ExtAttempt] != tc.attempt {
				t.Errorf("JSON round trip: %v, want %v", back, e)
			}
		})
	}
}

func TestConvertIsStable(t *testing.T) {
	a, err := Convert(actionEvent(1, 2), "test")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Convert(proto.Clone(actionEvent(1, 2)).(*eventsv1.ActionEvent), "test")
	if err != nil {
		t.Fatal(err)
	}
	if a.ID() != b.ID() || a.Source() != b.Source() {
		t.Errorf("a redelivered event converts to %s %s, first %s %s", b.Source(), b.ID(), a.Source(), a.ID())
	}
}

func TestConvertEveryPhase(t *testing.T) {
	want := map[flytecorev1.ActionPhase]string{
		flytecorev1.ActionPhase_ACTION_PHASE_QUEUED:                "org.flyte.action.queued.v1",
		flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES: "org.flyte.action.waiting_for_resources.v1",
		flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING:          "org.flyte.action.initializing.v1",
		flytecorev1.ActionPhase_ACTION_PHASE_RUNNING:               "org.flyte.action.running.v1",
		flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED:             "org.flyte.action.succeeded.v1",
		flytecorev1.ActionPhase_ACTION_PHASE_FAILED:                "org.flyte.action.failed.v1",
		flytecorev1.ActionPhase_ACTION_PHASE_ABORTED:               "org.flyte.action.aborted.v1",
		flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT:             "org.flyte.action.timed_out.v1",
	}
	if len(want) != len(flytecorev1.ActionPhase_name)-1 {
		t.Fatalf("the schema has %d phases besides unspecified; the test knows %d", len(flytecorev1.ActionPhase_name)-1, len(want))
	}
	for p, typ := range want {
		ev := actionEvent(0, 0)
		ev.Phase = p
		e, err := Convert(ev, "test")
		if err != nil {
			t.Fatalf("%v: %v", p, err)
		}
		if e.Type() != typ {
			t.Errorf("%v: type %q, want %q", p, e.Type(), typ)
		}
		name, _ := PhaseName(p)
		if !strings.Contains(e.ID(), "/"+name+"/") || e.Extensions()[ExtPhase] != name {
			t.Errorf("%v: id %q, flytephase %v", p, e.ID(), e.Extensions()[ExtPhase])
		}
	}
}

func TestConvertRefuses(t *testing.T) {
	edit := func(f func(ev *eventsv1.ActionEvent)) *eventsv1.ActionEvent {
		ev := actionEvent(0, 0)
		f(ev)
		return ev
	}
	tests := []struct {
		name, cluster, want string
		ev                  *eventsv1.ActionEvent
	}{
		{"nil", "test", "without an action id", nil},
		{"no id", "test", "without an action id", edit(func(ev *eventsv1.ActionEvent) { ev.Id = nil })},
		{"no project", "test", "has no project", edit(func(ev *eventsv1.ActionEvent) { ev.Id.Project = "" })},
		{"no action", "test", "has no action", edit(func(ev *eventsv1.ActionEvent) { ev.Id.Action = "" })},
		{"unspecified phase", "test", "no known phase", edit(func(ev *eventsv1.ActionEvent) { ev.Phase = 0 })},
		{"unknown phase", "test", "no known phase (99)", edit(func(ev *eventsv1.ActionEvent) { ev.Phase = 99 })},
		{"no occurred_at", "test", "occurred_at", edit(func(ev *eventsv1.ActionEvent) { ev.OccurredAt = nil })},
		{"bad occurred_at", "test", "occurred_at", edit(func(ev *eventsv1.ActionEvent) {
			ev.OccurredAt = &timestamppb.Timestamp{Seconds: 1, Nanos: -1}
		})},
		{"no cluster", "", "no cluster", actionEvent(0, 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Convert(tc.ev, tc.cluster)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestConvertSourceKeepsAHost(t *testing.T) {
	ev := actionEvent(0, 0)
	ev.Cluster = "eu west/1"
	e, err := Convert(ev, "test")
	if err != nil {
		t.Fatal(err)
	}
	if e.Source() != "flyte://eu_west_1/flytesnacks/development" {
		t.Errorf("source %q", e.Source())
	}
}

// TestTwoClustersEventsOfOneNameAreTwoEvents: an action is its name and its cluster, so
// the same change of two clusters' actions of one name is two CloudEvents: their source
// names the cluster, and a sink that drops duplicates by source and id (NATS by
// Nats-Msg-Id) keeps both.
func TestTwoClustersEventsOfOneNameAreTwoEvents(t *testing.T) {
	east, west := actionEvent(0, 1), actionEvent(0, 1)
	east.Cluster, west.Cluster = "east", "west"
	a, err := Convert(east, "home")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Convert(west, "home")
	if err != nil {
		t.Fatal(err)
	}
	if a.ID() != b.ID() {
		t.Fatalf("ids %q and %q; want one id for one change of one name", a.ID(), b.ID())
	}
	if MsgID(&a) == MsgID(&b) {
		t.Fatalf("both clusters' events have the Nats-Msg-Id %q; want them apart by source", MsgID(&a))
	}
}
