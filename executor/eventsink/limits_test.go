package eventsink

import (
	"os"
	"strings"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/test/repo"
)

// An action makes at most 1 + spec.retries + maxSystemFailures attempts, and the events
// contract refuses a larger attempt as a forgery: an action that could outgrow it would
// have its last events refused. Each limit is read from where it is enforced (the CRD's
// schema, the configuration's validation, the contract's rule), so that moving one
// alone fails here.
func TestTheAttemptLimitsAgree(t *testing.T) {
	retries := crdMaximum(t, "retries")
	failures := mostSystemFailures(t)
	contract := contractMaxAttempt(t)
	most := 1 + retries + failures
	t.Logf("1 + retries (%d) + maxSystemFailures (%d) = %d; the contract allows attempts up to %d", retries, failures, most, contract)
	if most > contract {
		t.Fatalf("an action may make %d attempts, but the events contract refuses attempts above %d", most, contract)
	}

	// The publisher's event of the last attempt passes the contract's validation; one
	// beyond the contract does not (the rule read above is the one enforced).
	p := New(nil, "test", nil, nil)
	for _, c := range []struct {
		attempt int64
		valid   bool
	}{{most, true}, {contract, true}, {contract + 1, false}} {
		ta := action("last", flytev1.PhaseRunning)
		ta.Status.PhaseHistory[0].Attempt = int32(c.attempt)
		err := protovalidate.Validate(p.toEvent(ta, ta.Status.PhaseHistory[0], timestamppb.Now()))
		if (err == nil) != c.valid {
			t.Errorf("attempt %d: validation says %v; want valid: %v", c.attempt, err, c.valid)
		}
	}
}

// crdMaximum is the schema's maximum of the TaskAction spec's field, over every version
// of the CRD as deployed.
func crdMaximum(t *testing.T, field string) int64 {
	t.Helper()
	path, err := repo.Path("deploy", "crd", "flyte.org_taskactions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	most := int64(-1)
	for _, v := range crd.Spec.Versions {
		prop := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties[field]
		if prop.Maximum == nil {
			t.Fatalf("%s: version %s has no maximum for spec.%s", path, v.Name, field)
		}
		most = max(most, int64(*prop.Maximum))
	}
	if most < 0 {
		t.Fatalf("%s: no version", path)
	}
	return most
}

// mostSystemFailures is the largest maxSystemFailures the configuration's validation
// accepts, found by bisection.
func mostSystemFailures(t *testing.T) int64 {
	t.Helper()
	accepted := func(n int64) bool {
		c := config.Default()
		c.MaxSystemFailures = int(n)
		err := c.Validate()
		return err == nil || !strings.Contains(err.Error(), "maxSystemFailures:")
	}
	lo, hi := int64(0), int64(1<<30) // lo is accepted, hi is not
	if !accepted(lo) || accepted(hi) {
		t.Fatalf("maxSystemFailures: 0 accepted %v, %d accepted %v: no upper limit to read", accepted(lo), hi, accepted(hi))
	}
	for hi-lo > 1 {
		if mid := lo + (hi-lo)/2; accepted(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// contractMaxAttempt is the protovalidate rule of ActionEvent.attempt, as generated.
func contractMaxAttempt(t *testing.T) int64 {
	t.Helper()
	field := (&eventsv1.ActionEvent{}).ProtoReflect().Descriptor().Fields().ByName("attempt")
	if field == nil {
		t.Fatal("ActionEvent has no field attempt")
	}
	rules, ok := proto.GetExtension(field.Options(), validate.E_Field).(*validate.FieldRules)
	if !ok || rules.GetUint32() == nil || !rules.GetUint32().HasLte() {
		t.Fatalf("ActionEvent.attempt has no uint32 lte rule: %v", rules)
	}
	return int64(rules.GetUint32().GetLte())
}

// A cluster event as long as the CRD lets the history hold it reaches the events service
// whole, every field (the reporting component among them) within the contract's rules.
func TestClusterEventsAtTheCRDsLimitsPassTheContract(t *testing.T) {
	text := func(n int) string { return strings.Repeat("x", n) }
	ta := action("events", flytev1.PhaseRunning)
	want := flytev1.ClusterEvent{OccurredAt: metav1.Now(), Object: text(flytev1.MaxClusterEventObjectLength),
		Type: text(flytev1.MaxClusterEventTypeLength), Reason: text(flytev1.MaxReasonLength),
		Message: text(flytev1.MaxClusterEventMessageLength), Source: text(flytev1.MaxClusterEventSourceLength), Count: 3}
	ta.Status.PhaseHistory[0].ClusterEvents = []flytev1.ClusterEvent{want}
	ev := New(nil, "test", nil, nil).toEvent(ta, ta.Status.PhaseHistory[0], timestamppb.Now())
	if err := protovalidate.Validate(ev); err != nil {
		t.Fatal(err)
	}
	got := ev.GetClusterEvents()
	if len(got) != 1 || got[0].GetObject() != want.Object || got[0].GetType() != want.Type || got[0].GetReason() != want.Reason ||
		got[0].GetMessage() != want.Message || got[0].GetSource() != want.Source || got[0].GetCount() != 3 {
		t.Fatalf("published %v; want %+v", got, want)
	}
}
