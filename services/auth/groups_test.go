package auth

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// TestByGroup: in token-file mode executors may do everything; viewers may read within
// a project and nothing cluster-wide (the CloudEvents egress holds every project's
// events and its sinks' configuration); operators may call the egress RPCs, as
// ClusterRole flyte-services-egress-operator grants, and nothing else; anyone else
// nothing.
func TestByGroup(t *testing.T) {
	type call struct{ group, resource, verb, project string }
	var (
		getAction      = call{"events.flyte.org", "actions", VerbGet, "team-a"}
		listActions    = call{"events.flyte.org", "actions", VerbList, "team-a"}
		watchActions   = call{"events.flyte.org", "actions", VerbWatch, "team-a"}
		record         = call{"events.flyte.org", "events", VerbCreate, "team-a"}
		cacheGet       = call{"cache.flyte.org", "entries", VerbGet, "team-a"}
		listSinks      = call{"events.flyte.org", "sinks", VerbList, ""}
		listDead       = call{"events.flyte.org", "deadletters", VerbList, ""}
		replayDead     = call{"events.flyte.org", "deadletters", VerbUpdate, ""}
		clusterGet     = call{"events.flyte.org", "actions", VerbGet, ""} // a project rule whose request named none
		otherCluster   = call{"events.flyte.org", "events", VerbCreate, ""}
		everyCall      = []call{getAction, listActions, watchActions, record, cacheGet, listSinks, listDead, replayDead, clusterGet, otherCluster}
		projectReads   = []call{getAction, listActions, watchActions, cacheGet}
		egressRPCs     = []call{listSinks, listDead, replayDead}
		viewerOperator = append(append([]call{}, projectReads...), egressRPCs...)
	)
	tests := []struct {
		name    string
		groups  []string
		allowed []call
	}{
		{"executor", []string{Executors}, everyCall},
		{"viewer", []string{Viewers}, projectReads},
		{"operator", []string{Operators}, egressRPCs},
		{"viewer and operator", []string{Viewers, Operators}, viewerOperator},
		{"no group of ours", []string{"system:authenticated"}, nil},
		{"no group", nil, nil},
	}
	for _, tc := range tests {
		for _, c := range everyCall {
			t.Run(fmt.Sprintf("%s/%s.%s/%s/%q", tc.name, c.resource, c.group, c.verb, c.project), func(t *testing.T) {
				want := authorizer.DecisionDeny
				for _, a := range tc.allowed {
					if a == c {
						want = authorizer.DecisionAllow
					}
				}
				attrs := Rule{Group: c.group, Resource: c.resource, Verb: c.verb}.attributes(&user.DefaultInfo{Name: tc.name, Groups: tc.groups}, c.project)
				got, _, err := byGroup.Authorize(context.Background(), attrs)
				if err != nil || got != want {
					t.Errorf("decision %v (%v), want %v", got, err, want)
				}
			})
		}
	}
}
