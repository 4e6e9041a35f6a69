package cacheservice

import (
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	"github.com/flytekube/backend/services/auth"
)

// APIGroup is the API group of the cache service's virtual resources: RBAC rules name
// it to grant "entries" (read, write, delete) and "reservations" per project.
const APIGroup = "cache.flyte.org"

// keyed is a request that names one cache key.
type keyed interface{ GetKey() *cachev1.CacheKey }

// Rules say what each RPC needs, in the project its key names.
func Rules() auth.Rules {
	byKey := func(resource, verb string) auth.Rule {
		return auth.Rule{Group: APIGroup, Resource: resource, Verb: verb, Projects: func(m any) []string {
			return []string{m.(keyed).GetKey().GetProject()}
		}}
	}
	// putKeyed names the project of a PutAndRelease, whose key is in its put.
	putKeyed := func(resource, verb string) auth.Rule {
		return auth.Rule{Group: APIGroup, Resource: resource, Verb: verb, Projects: func(m any) []string {
			return []string{m.(*cachev1.PutAndReleaseRequest).GetPut().GetKey().GetProject()}
		}}
	}
	both := func(first, second auth.Rule) auth.Rule {
		first.Also = []auth.Rule{second}
		return first
	}
	return auth.Rules{
		cachev1connect.CacheServiceGetProcedure:    byKey("entries", auth.VerbGet),
		cachev1connect.CacheServicePutProcedure:    byKey("entries", auth.VerbCreate),
		cachev1connect.CacheServiceDeleteProcedure: byKey("entries", auth.VerbDelete),
		cachev1connect.CacheServiceInvalidateProcedure: {
			Group: APIGroup, Resource: "entries", Verb: auth.VerbDelete, Projects: func(m any) []string {
				return []string{m.(*cachev1.InvalidateRequest).GetProject()}
			},
		},
		cachev1connect.CacheServiceGetOrExtendReservationProcedure: byKey("reservations", auth.VerbUpdate),
		cachev1connect.CacheServiceReleaseReservationProcedure:     byKey("reservations", auth.VerbUpdate),
		cachev1connect.CacheServiceLookupOrReserveProcedure:        both(byKey("entries", auth.VerbGet), byKey("reservations", auth.VerbUpdate)),
		cachev1connect.CacheServicePutAndReleaseProcedure: both(
			putKeyed("entries", auth.VerbCreate), putKeyed("reservations", auth.VerbUpdate)),
	}
}
