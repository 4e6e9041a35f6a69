package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/test/repo"
)

// FinalizerAtAdmission installs the policy of the component finalizer-at-admission
// (deploy/kustomize/components), its binding held to namespace ns (the shipped one binds
// the whole cluster, and tests share an API server), and returns once an action created
// there is stored with finalizer on. remove takes the policy away.
func FinalizerAtAdmission(ctx context.Context, c client.Client, ns, finalizer string) (remove func(), err error) {
	root, err := repo.Root()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy/kustomize/components/finalizer-at-admission/policy.yaml"))
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	var made []*unstructured.Unstructured
	remove = func() {
		for _, u := range made {
			_ = c.Delete(context.Background(), u)
		}
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return remove, fmt.Errorf("kubetest: the finalizer policy: %w", err)
		}
		u.SetName(u.GetName() + "-" + ns)
		if u.GetKind() == "MutatingAdmissionPolicyBinding" {
			if err := unstructured.SetNestedField(u.Object, u.GetName(), "spec", "policyName"); err != nil {
				return remove, err
			}
			if err := unstructured.SetNestedStringMap(u.Object, map[string]string{"kubernetes.io/metadata.name": ns},
				"spec", "matchResources", "namespaceSelector", "matchLabels"); err != nil {
				return remove, err
			}
		}
		if err := c.Create(ctx, u); err != nil {
			return remove, fmt.Errorf("kubetest: creating %s: %w", u.GetKind(), err)
		}
		made = append(made, u)
	}
	// The API server loads a new policy within a second or so; until then actions are
	// stored without it.
	deadline := time.Now().Add(time.Minute)
	for {
		// Unstructured, so that a client of any scheme can send it.
		probe := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "flyte.org/v1", "kind": "TaskAction",
			"metadata": map[string]any{"name": "finalizer-probe", "namespace": ns},
			"spec": map[string]any{"project": Project, "domain": "development", "runName": "probe", "actionName": "probe",
				"taskName": "probe", "taskType": "core-sleep", "runOutputBase": "mem://probe"},
		}}
		err := c.Create(ctx, probe, client.DryRunAll)
		if err == nil && slices.Contains(probe.GetFinalizers(), finalizer) {
			return remove, nil
		}
		if time.Now().After(deadline) {
			return remove, fmt.Errorf("kubetest: the finalizer policy did not put %s on within a minute (last: %v)", finalizer, err)
		}
		select {
		case <-ctx.Done():
			return remove, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
