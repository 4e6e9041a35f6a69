package v1_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/repo"
)

// TestLimitsMatchTheCRD: the constants the executor cuts status text to are the limits
// the generated CRD enforces, so a change to one side cannot leave the other behind.
func TestLimitsMatchTheCRD(t *testing.T) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := repo.ReadYAML(&crd, "deploy", "crd", "flyte.org_taskactions.yaml"); err != nil {
		t.Fatal(err)
	}
	status := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"]
	entry := status.Properties["phaseHistory"].Items.Schema
	errorSchema := entry.Properties["error"]
	link := entry.Properties["logLinks"].Items.Schema
	event := entry.Properties["clusterEvents"].Items.Schema
	tests := []struct {
		field  string
		schema apiextensionsv1.JSONSchemaProps
		items  bool // MaxItems rather than MaxLength
		want   int64
	}{
		{"phaseHistory[].reason", entry.Properties["reason"], false, flytev1.MaxReasonLength},
		{"phaseHistory[].message", entry.Properties["message"], false, flytev1.MaxHistoryMessageLength},
		{"phaseHistory[].error.code", errorSchema.Properties["code"], false, flytev1.MaxErrorCodeLength},
		{"phaseHistory[].error.message", errorSchema.Properties["message"], false, flytev1.MaxErrorMessageLength},
		{"status.error.message", status.Properties["error"].Properties["message"], false, flytev1.MaxErrorMessageLength},
		{"phaseHistory[].logLinks", entry.Properties["logLinks"], true, flytev1.MaxLogLinks},
		{"phaseHistory[].logLinks[].name", link.Properties["name"], false, flytev1.MaxLogLinkNameLength},
		{"phaseHistory[].logLinks[].uri", link.Properties["uri"], false, flytev1.MaxLogLinkURILength},
		{"phaseHistory[].clusterEvents", entry.Properties["clusterEvents"], true, flytev1.MaxClusterEvents},
		{"phaseHistory[].clusterEvents[].object", event.Properties["object"], false, flytev1.MaxClusterEventObjectLength},
		{"phaseHistory[].clusterEvents[].type", event.Properties["type"], false, flytev1.MaxClusterEventTypeLength},
		{"phaseHistory[].clusterEvents[].reason", event.Properties["reason"], false, flytev1.MaxReasonLength},
		{"phaseHistory[].clusterEvents[].message", event.Properties["message"], false, flytev1.MaxClusterEventMessageLength},
		{"phaseHistory[].clusterEvents[].source", event.Properties["source"], false, flytev1.MaxClusterEventSourceLength},
		{"conditions[].message", status.Properties["conditions"].Items.Schema.Properties["message"], false, flytev1.MaxConditionMessageLength},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			limit := tt.schema.MaxLength
			if tt.items {
				limit = tt.schema.MaxItems
			}
			if limit == nil || *limit != tt.want {
				t.Fatalf("the CRD allows %v; the constant says %d", limit, tt.want)
			}
		})
	}
}

// TestSpecLimitsMatchTheCRD: the limits of the spec that docs/executor.md's table
// states are the CRD's markers and rules, whichever of them carries each.
func TestSpecLimitsMatchTheCRD(t *testing.T) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := repo.ReadYAML(&crd, "deploy", "crd", "flyte.org_taskactions.yaml"); err != nil {
		t.Fatal(err)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	container := spec.Properties["container"]
	envItem := *container.Properties["env"].Items.Schema
	metadata := spec.Properties["podTemplate"].Properties["metadata"]
	type kind int
	const (
		maxLength kind = iota
		maxItems
		maxProperties
		rule // an x-kubernetes-validations rule, found by its message
	)
	tests := []struct {
		field   string
		schema  apiextensionsv1.JSONSchemaProps
		kind    kind
		message string // of the rule
		want    int64
	}{
		{"timeout", spec.Properties["timeout"], rule, "timeout is at most", flytev1.MaxTimeoutLength},
		{"container.command", container.Properties["command"], maxItems, "", flytev1.MaxArgs},
		{"container.command[]", *container.Properties["command"].Items.Schema, maxLength, "", flytev1.MaxArgLength},
		{"container.args", container.Properties["args"], maxItems, "", flytev1.MaxArgs},
		{"container.args[]", *container.Properties["args"].Items.Schema, maxLength, "", flytev1.MaxArgLength},
		{"container: command and args", container, rule, "command and args are at most", flytev1.MaxCommandLineLength},
		{"container.env", container.Properties["env"], maxItems, "", flytev1.MaxEnv},
		{"container.env[].name", envItem, rule, "env names are at most", flytev1.MaxEnvNameLength},
		{"container.env[].value", envItem, rule, "env values are at most", flytev1.MaxValueLength},
		{"container.env[].valueFrom", envItem, rule, "the names in valueFrom are at most", flytev1.MaxReferenceLength},
		{"container.resources: entries", container.Properties["resources"], rule, "resources' limits and requests name at most", flytev1.MaxResourceNames},
		{"container.resources: names", container.Properties["resources"], rule, "resource names are at most", flytev1.MaxResourceNameLength},
		{"container.resources: quantities", container.Properties["resources"], rule, "quantities are at most", flytev1.MaxQuantityLength},
		{"container.resources.claims", container.Properties["resources"], rule, "resources' claims are at most", flytev1.MaxResourceClaims},
		{"container.resources.claims[]", container.Properties["resources"], rule, "claim names are at most", flytev1.MaxReferenceLength},
		{"envVars", spec.Properties["envVars"], maxProperties, "", flytev1.MaxEnvVars},
		{"envVars: names", spec.Properties["envVars"], rule, "envVars names are at most", flytev1.MaxEnvNameLength},
		{"envVars: values", spec.Properties["envVars"], rule, "envVars values are at most", flytev1.MaxValueLength},
		{"config", spec.Properties["config"], maxProperties, "", flytev1.MaxConfig},
		{"config: keys", spec.Properties["config"], rule, "config keys are at most", flytev1.MaxKeyLength},
		{"config: values", spec.Properties["config"], rule, "config values are at most", flytev1.MaxValueLength},
		{"secrets", spec.Properties["secrets"], maxItems, "", flytev1.MaxSecrets},
		{"secrets[].env", spec.Properties["secrets"].Items.Schema.Properties["env"], maxLength, "", flytev1.MaxEnvNameLength},
		{"cache.ignoredInputs", spec.Properties["cache"].Properties["ignoredInputs"], maxItems, "", flytev1.MaxIgnoredInputs},
		{"cache.ignoredInputs[]", *spec.Properties["cache"].Properties["ignoredInputs"].Items.Schema, maxLength, "", flytev1.MaxIgnoredInputLength},
		{"podTemplate.metadata.labels", metadata.Properties["labels"], maxProperties, "", flytev1.MaxPodLabels},
		{"podTemplate.metadata.labels: keys", metadata.Properties["labels"], rule, "label keys are at most", flytev1.MaxKeyLength},
		{"podTemplate.metadata.labels: values", metadata.Properties["labels"], rule, "label values are at most", flytev1.MaxLabelValueLength},
		{"podTemplate.metadata.annotations", metadata.Properties["annotations"], maxProperties, "", flytev1.MaxPodAnnotations},
		{"podTemplate.metadata.annotations: keys", metadata.Properties["annotations"], rule, "annotation keys are at most", flytev1.MaxKeyLength},
		{"podTemplate.metadata.annotations: values", metadata.Properties["annotations"], rule, "annotation values are at most", flytev1.MaxValueLength},
		{"spec: its texts together", spec, rule, "the spec's texts are at most", flytev1.MaxSpecTextLength},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			var got *int64
			switch tt.kind {
			case maxLength:
				got = tt.schema.MaxLength
			case maxItems:
				got = tt.schema.MaxItems
			case maxProperties:
				got = tt.schema.MaxProperties
			case rule:
				checkRules(t, tt.schema.XValidations, tt.message, tt.want)
				return
			}
			if got == nil || *got != tt.want {
				t.Fatalf("the CRD allows %v; the constant says %d", got, tt.want)
			}
		})
	}
}

// checkRules: the rules whose message starts with message (there may be several, one a
// map) compare with the limit and say it, and no other number of that kind.
func checkRules(t *testing.T, rules apiextensionsv1.ValidationRules, message string, want int64) {
	t.Helper()
	limit := regexp.MustCompile(`<= (\d+)`)
	found := 0
	for _, r := range rules {
		if !strings.HasPrefix(r.Message, message) {
			continue
		}
		found++
		bounds := limit.FindAllStringSubmatch(r.Rule, -1)
		if len(bounds) == 0 {
			t.Errorf("rule %q compares with no limit", r.Rule)
		}
		for _, b := range bounds {
			if b[1] != strconv.FormatInt(want, 10) {
				t.Errorf("rule %q allows %s; the constant says %d", r.Rule, b[1], want)
			}
		}
		if !strings.Contains(r.Message, strconv.FormatInt(want, 10)) {
			t.Errorf("message %q does not say %d", r.Message, want)
		}
	}
	if found == 0 {
		t.Fatalf("no rule says %q", message)
	}
}
