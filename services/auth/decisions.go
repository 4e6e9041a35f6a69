package auth

import (
	"context"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// cachedDecisions remembers the API server's answers by a plain string key. The
// SubjectAccessReview authorizer has a cache of its own, but keys it by the review
// encoded as JSON, which costs more on every call than the rest of authorization.
type cachedDecisions struct {
	next              authorizer.Authorizer
	decisions         *cache.LRUExpireCache
	allowTTL, denyTTL time.Duration
}

type decision struct {
	value  authorizer.Decision
	reason string
}

func newCachedDecisions(next authorizer.Authorizer, allowTTL, denyTTL time.Duration) authorizer.Authorizer {
	c := &cachedDecisions{next: next, decisions: cache.NewLRUExpireCache(8192), allowTTL: allowTTL, denyTTL: denyTTL}
	return authorizer.AuthorizerFunc(c.authorize)
}

func (c *cachedDecisions) authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	key := decisionKey(a)
	if d, ok := c.decisions.Get(key); ok {
		return d.(decision).value, d.(decision).reason, nil
	}
	value, reason, err := c.next.Authorize(ctx, a)
	if err != nil {
		return value, reason, err // not kept: the next call asks again
	}
	ttl := c.denyTTL
	if value == authorizer.DecisionAllow {
		ttl = c.allowTTL
	}
	c.decisions.Add(key, decision{value, reason}, ttl)
	return value, reason, nil
}

// decisionKey holds everything a review sends: who (name, UID, groups, extra) and what
// (verb, resource, namespace), NUL-separated since none of them holds a NUL.
func decisionKey(a authorizer.Attributes) string {
	u := a.GetUser()
	var b strings.Builder
	for _, s := range []string{u.GetName(), u.GetUID(), a.GetVerb(), a.GetAPIGroup(), a.GetResource(), a.GetNamespace()} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, g := range u.GetGroups() {
		b.WriteString(g)
		b.WriteByte(1)
	}
	extra := u.GetExtra()
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteByte(0)
		b.WriteString(k)
		for _, v := range extra[k] {
			b.WriteByte(1)
			b.WriteString(v)
		}
	}
	return b.String()
}
