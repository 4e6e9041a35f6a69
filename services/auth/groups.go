package auth

import (
	"context"
	"slices"

	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// byGroup is token-file mode's policy: Executors may do everything, Viewers may read
// within a project, Operators may call the CloudEvents egress, and nobody else may do
// anything.
var byGroup = authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	groups := a.GetUser().GetGroups()
	switch {
	case slices.Contains(groups, Executors):
		return authorizer.DecisionAllow, "", nil
	case slices.Contains(groups, Viewers) && readOnly(a.GetVerb()) && inProject(a):
		return authorizer.DecisionAllow, "", nil
	case slices.Contains(groups, Operators) && egress(a):
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionDeny, "", nil
})

// inProject reports whether a is checked in a project. A cluster-wide rule (one without
// projects) is checked in none: what it reads spans every project, so reading a
// project's runs does not grant it.
func inProject(a authorizer.Attributes) bool { return a.GetNamespace() != "" }

// egressGrants are what Operators may do, cluster-wide: what ClusterRole
// flyte-services-egress-operator grants (deploy/kustomize/base/access/roles.yaml), on
// the resources the events service's egress rules name. A new cluster-wide rule stays
// closed to them until it is added here.
var egressGrants = []struct{ group, resource, verb string }{
	{"events.flyte.org", "sinks", VerbList},
	{"events.flyte.org", "deadletters", VerbList},
	{"events.flyte.org", "deadletters", VerbUpdate},
}

// egress reports whether a is one of egressGrants, checked cluster-wide.
func egress(a authorizer.Attributes) bool {
	if inProject(a) {
		return false
	}
	for _, g := range egressGrants {
		if a.GetAPIGroup() == g.group && a.GetResource() == g.resource && a.GetVerb() == g.verb {
			return true
		}
	}
	return false
}

// allowAll is mode none's policy.
var allowAll = authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	return authorizer.DecisionAllow, "", nil
})
