package v1_test

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/internal/repo"
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
