package kubetest

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// ApplyCRD applies the CRD in the YAML file at path server-side, as field owner owner,
// and waits (up to a minute) until the API server has established it. Applied over an
// older version of itself, it is the upgrade of the CRD. It is how everything here that
// runs against a cluster of its own installs the CRD (make run, the chaos soak, the
// upgrade test, the compose file's test), as a user would with kubectl apply
// --server-side; envtest installs it for Start.
func ApplyCRD(ctx context.Context, c client.Client, path, owner string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("CRD: %w", err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		return fmt.Errorf("CRD %s: %w", path, err)
	}
	crd := &unstructured.Unstructured{Object: obj}
	if err := c.Patch(ctx, crd, client.Apply, client.FieldOwner(owner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying the CRD of %s: %w", path, err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if err := c.Get(waitCtx, client.ObjectKeyFromObject(crd), crd); err == nil && established(crd) {
			return nil
		}
		select {
		case <-waitCtx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for the CRD of %s: %w", path, ctx.Err())
			}
			return fmt.Errorf("the CRD of %s was not established within a minute", path)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// established says whether the CRD's Established condition is True.
func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, cond := range conds {
		if m, _ := cond.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
