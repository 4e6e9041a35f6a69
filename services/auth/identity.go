// Package auth decides who is calling a service and what they may do: bearer tokens are
// authenticated (TokenReview, a static token file, or nobody when asked for by name)
// before a request body is read, and each RPC is authorized as a verb on a resource of
// the request's project.
package auth

import (
	"context"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// Anonymous is the identity of calls when authentication is off (mode none).
var Anonymous user.Info = &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}

// WithUser returns ctx carrying the caller's identity.
func WithUser(ctx context.Context, u user.Info) context.Context { return request.WithUser(ctx, u) }

// UserFrom returns the identity the request was authenticated as; Anonymous when the
// request carries none.
func UserFrom(ctx context.Context) user.Info {
	if u, ok := request.UserFrom(ctx); ok && u != nil {
		return u
	}
	return Anonymous
}

// IdentityOf names the caller as the services remember it (a reservation's holder, a
// watcher's quota): its name, and for a caller bound to a cluster, the cluster before it,
// since a ServiceAccount's name means something only in the cluster that issued it (two
// clusters' executors often share one). Unbound callers keep their plain name, as stored
// by earlier releases.
func IdentityOf(u user.Info) string {
	if cluster, ok := ClusterOf(u); ok {
		return "cluster:" + cluster + "/" + u.GetName()
	}
	return u.GetName()
}
