package auth

import (
	"context"
	"slices"

	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// byGroup is token-file mode's policy: Executors may do everything, Viewers may read,
// and nobody else may do anything.
var byGroup = authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	groups := a.GetUser().GetGroups()
	switch {
	case slices.Contains(groups, Executors):
		return authorizer.DecisionAllow, "", nil
	case slices.Contains(groups, Viewers) && readOnly(a.GetVerb()):
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionDeny, "", nil
})

// allowAll is mode none's policy.
var allowAll = authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	return authorizer.DecisionAllow, "", nil
})
