package cloudevents

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/protobuf/encoding/protojson"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// Extension attributes every converted event carries, so that a consumer can route and
// filter on the action without decoding data. CloudEvents extension names are lower-case
// letters and digits only.
const (
	ExtProject = "flyteproject"
	ExtDomain  = "flytedomain"
	ExtRun     = "flyterun"
	ExtAction  = "flyteaction"
	ExtAttempt = "flyteattempt" // an Integer
	ExtPhase   = "flytephase"
	// ExtPartitionKey is the Partitioning extension's attribute: the action's key
	// (<project>/<domain>/<run>/<action>). The Kafka binding maps it to the record key,
	// which keeps an action's events on one partition, in order.
	ExtPartitionKey = "partitionkey"
)

// marshalData encodes the event as data: protojson with the default camelCase field
// names (the JSON mapping of the contract), zero values left out.
var marshalData = protojson.MarshalOptions{}

// Convert turns a stored action event into a CloudEvent 1.0. The id is the event's
// identity, <project>/<domain>/<run>/<action>/<attempt>/<phase>/<version>, so a
// redelivered event keeps its id and a consumer (or JetStream's duplicate window) can
// drop the copy. cluster names the source when the event does not name its own cluster.
func Convert(ev *eventsv1.ActionEvent, cluster string) (event.Event, error) {
	id := ev.GetId()
	if ev == nil || id == nil {
		return event.Event{}, fmt.Errorf("cloudevents: an event without an action id")
	}
	for _, f := range []struct{ name, value string }{
		{"project", id.GetProject()}, {"domain", id.GetDomain()}, {"run", id.GetRun()}, {"action", id.GetAction()},
	} {
		if f.value == "" {
			return event.Event{}, fmt.Errorf("cloudevents: event of action %s has no %s", key(id), f.name)
		}
	}
	phase, ok := PhaseName(ev.GetPhase())
	if !ok {
		return event.Event{}, fmt.Errorf("cloudevents: event of action %s has no known phase (%d)", key(id), ev.GetPhase())
	}
	occurred := ev.GetOccurredAt()
	if err := occurred.CheckValid(); err != nil {
		return event.Event{}, fmt.Errorf("cloudevents: event of action %s: occurred_at: %w", key(id), err)
	}
	if ev.GetCluster() != "" {
		cluster = ev.GetCluster()
	}
	if cluster == "" {
		return event.Event{}, fmt.Errorf("cloudevents: event of action %s: no cluster to name the source", key(id))
	}
	data, err := marshalData.Marshal(ev)
	if err != nil {
		return event.Event{}, fmt.Errorf("cloudevents: event of action %s: encoding data: %w", key(id), err)
	}

	e := event.New(event.CloudEventsVersionV1)
	e.SetID(key(id) + "/" + strconv.FormatUint(uint64(ev.GetAttempt()), 10) + "/" + phase + "/" + strconv.FormatUint(uint64(ev.GetVersion()), 10))
	e.SetSource("flyte://" + hostSafe(cluster) + "/" + url.PathEscape(id.GetProject()) + "/" + url.PathEscape(id.GetDomain()))
	e.SetType(TypeFor(phase))
	e.SetSubject(id.GetRun() + "/" + id.GetAction())
	e.SetTime(occurred.AsTime())
	if err := e.SetData(event.ApplicationJSON, data); err != nil {
		return event.Event{}, fmt.Errorf("cloudevents: event of action %s: setting data: %w", key(id), err)
	}
	e.SetExtension(ExtProject, id.GetProject())
	e.SetExtension(ExtDomain, id.GetDomain())
	e.SetExtension(ExtRun, id.GetRun())
	e.SetExtension(ExtAction, id.GetAction())
	// Attempts are at most 111 (the store refuses more); the extension is an Integer
	// (int32), so a larger value would not fit.
	if ev.GetAttempt() > 1<<31-1 {
		return event.Event{}, fmt.Errorf("cloudevents: event of action %s: attempt %d is out of range", key(id), ev.GetAttempt())
	}
	e.SetExtension(ExtAttempt, int32(ev.GetAttempt()))
	e.SetExtension(ExtPhase, phase)
	e.SetExtension(ExtPartitionKey, key(id))
	// SetExtension and SetData record their errors in the event; Validate reports them
	// along with any attribute the spec requires.
	if err := e.Validate(); err != nil {
		return event.Event{}, fmt.Errorf("cloudevents: event of action %s: %w", key(id), err)
	}
	return e, nil
}

// hostSafe makes a cluster name fit a URI's host: letters, digits and "-._~" stay, any
// other character (which Go's URL parser, and so the SDK, refuses in a host even
// percent-encoded) becomes '_'. Cluster names are DNS names in practice, left as they are.
func hostSafe(cluster string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("-._~", r):
			return r
		}
		return '_'
	}, cluster)
}

// key is an action's key: <project>/<domain>/<run>/<action>.
func key(id *flytecorev1.ActionIdentifier) string {
	return id.GetProject() + "/" + id.GetDomain() + "/" + id.GetRun() + "/" + id.GetAction()
}

// TypeFor is the CloudEvent type of an event of the phase named phase (as PhaseName
// gives it): org.flyte.action.<phase>.v1.
func TypeFor(phase string) string { return "org.flyte.action." + phase + ".v1" }

// PhaseName is a phase's name in ids, types and filters: its enum name without the
// ACTION_PHASE_ prefix, in lower case ("queued", "waiting_for_resources", "timed_out").
// It reports false for the unspecified phase and for values the schema does not name.
func PhaseName(p flytecorev1.ActionPhase) (string, bool) {
	if p == flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED {
		return "", false
	}
	name, ok := flytecorev1.ActionPhase_name[int32(p)]
	if !ok {
		return "", false
	}
	return strings.ToLower(strings.TrimPrefix(name, "ACTION_PHASE_")), true
}

// phaseByName is PhaseName's inverse, for the phase= filter.
func phaseByName(name string) (flytecorev1.ActionPhase, bool) {
	for v := range flytecorev1.ActionPhase_name {
		p := flytecorev1.ActionPhase(v)
		if n, ok := PhaseName(p); ok && n == name {
			return p, true
		}
	}
	return 0, false
}

// phaseNames lists every phase's name in enum order, for error messages.
func phaseNames() []string {
	values := slices.Sorted(maps.Keys(flytecorev1.ActionPhase_name))
	var names []string
	for _, v := range values {
		if n, ok := PhaseName(flytecorev1.ActionPhase(v)); ok {
			names = append(names, n)
		}
	}
	return names
}
