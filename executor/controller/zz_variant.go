package controller

import (
	"context"
	"os"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TEMPORARY measurement switch (removed after): FLYTE_STATUS_WRITE = "" (Update),
// "patch-lock" (merge patch under the optimistic lock, expectations kept), "patch"
// (merge patch without a precondition, no expectations for the status).
var statusVariant = os.Getenv("FLYTE_STATUS_WRITE")

func (s *scope) writeStatusVariant(ctx context.Context) error {
	switch statusVariant {
	case "patch-lock", "patch":
		base := s.ta.DeepCopy()
		base.Status = *s.before.DeepCopy()
		var p client.Patch = client.MergeFrom(base)
		if statusVariant == "patch-lock" {
			p = client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})
		}
		return s.r.Client.Status().Patch(ctx, s.ta, p)
	}
	return s.r.Client.Status().Update(ctx, s.ta)
}
