package auth

import (
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// Verbs a Rule may name, as Kubernetes RBAC spells them.
const (
	VerbGet    = "get"
	VerbList   = "list"
	VerbWatch  = "watch"
	VerbCreate = "create"
	VerbUpdate = "update"
	VerbDelete = "delete"
)

// Rule is what one RPC needs: a verb on a resource of an API group of ours, in every
// project the request touches. Projects play the namespace, so a cluster admin grants
// per-project access with ordinary Roles and RoleBindings.
type Rule struct {
	Group, Resource, Verb string
	// Projects lists the projects the (validated) request message touches; each one
	// must be allowed. An empty list checks the rule cluster-wide.
	Projects func(msg any) []string
	// Clusters lists the clusters the request acts for (the cluster of each event it
	// records): a caller bound to a cluster may act only for its own, and a request that
	// names none ("") is refused it too. Nil checks nothing.
	Clusters func(msg any) []string
	// Also are further rules the call needs, each checked as this one: an RPC that does
	// the work of two (a lookup that also reserves) needs what both need.
	Also []Rule
}

// Rules maps a procedure ("/package.Service/Method") to its rule. A procedure without a
// rule is refused: a new RPC is closed until someone decides who may call it.
type Rules map[string]Rule

// readOnly reports whether a verb only reads.
func readOnly(verb string) bool {
	return verb == VerbGet || verb == VerbList || verb == VerbWatch
}

func (r Rule) attributes(u userInfo, project string) authorizer.AttributesRecord {
	return authorizer.AttributesRecord{
		User:            u,
		Verb:            r.Verb,
		Namespace:       project,
		APIGroup:        r.Group,
		APIVersion:      "v1",
		Resource:        r.Resource,
		ResourceRequest: true,
	}
}
