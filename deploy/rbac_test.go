package deploy_test

// What an overlay's RBAC lets its ServiceAccounts do, as the API server decides it.

import (
	"context"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// rbacReviews asks the API server, by SubjectAccessReview, what the RBAC objects an
// overlay renders (applied for real by applyAll) let a ServiceAccount do.
type rbacReviews struct {
	t       *testing.T
	applied []*unstructured.Unstructured
	granted []authorizationv1.SubjectAccessReviewSpec // to be denied again once removed
}

// allowed reports whether the API server lets the ServiceAccount sa do verb on resource
// of group in namespace ("" for a cluster-wide resource). RBAC's authorizer follows the
// objects through a cache, so a denial is asked again for a few seconds before it counts.
func (r *rbacReviews) allowed(sa rbacv1.Subject, namespace, group, resource, verb string) bool {
	spec := authorizationv1.SubjectAccessReviewSpec{
		User:               serviceaccount.MakeUsername(sa.Namespace, sa.Name),
		Groups:             append(serviceaccount.MakeGroupNames(sa.Namespace), user.AllAuthenticated),
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Group: group, Resource: resource, Verb: verb},
	}
	ok := r.poll(r.t.Context(), spec, true)
	if ok {
		r.granted = append(r.granted, spec)
	}
	return ok
}

// allowedNow asks once, for a denial expected after allowed has seen the same objects
// granting something else (so the authorizer's cache holds them).
func (r *rbacReviews) allowedNow(sa rbacv1.Subject, namespace, group, resource, verb string) bool {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               serviceaccount.MakeUsername(sa.Namespace, sa.Name),
		Groups:             append(serviceaccount.MakeGroupNames(sa.Namespace), user.AllAuthenticated),
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Group: group, Resource: resource, Verb: verb},
	}}
	if err := env.Client.Create(r.t.Context(), sar); err != nil {
		r.t.Fatalf("SubjectAccessReview: %v", err)
	}
	return sar.Status.Allowed
}

// poll asks until the answer is want or five seconds have passed, and returns the last
// answer. It asks twice a second, which client-go's rate limit allows.
func (r *rbacReviews) poll(ctx context.Context, spec authorizationv1.SubjectAccessReviewSpec, want bool) bool {
	var got bool
	var failed error
	_ = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: spec}
		if failed = env.Client.Create(ctx, sar); failed != nil {
			return false, nil // asked again
		}
		got = sar.Status.Allowed
		return got == want, nil
	})
	if failed != nil {
		r.t.Fatalf("SubjectAccessReview: %v", failed)
	}
	return got
}

// remove deletes the RBAC objects applied and waits for every permission found allowed
// to be denied again, so that the next overlay is judged by its own objects alone.
func (r *rbacReviews) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, u := range r.applied {
		if err := env.Client.Delete(ctx, u); client.IgnoreNotFound(err) != nil {
			r.t.Errorf("deleting %s: %v", id(u), err)
		}
	}
	for _, spec := range r.granted {
		if r.poll(ctx, spec, false) {
			r.t.Errorf("%s may still %s %s once the overlay's RBAC is removed", spec.User, spec.ResourceAttributes.Verb, spec.ResourceAttributes.Resource)
		}
	}
}
