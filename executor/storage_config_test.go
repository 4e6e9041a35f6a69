package executor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/test/eventually"
)

// TestFileOutputBaseWithoutAllowedPrefixesFailsAtOnce: file:// is refused unless
// storage.allowedPrefixes names it, so an action whose runOutputBase is file:// on an
// executor with none fails at its first pass, before its pod is made, with an error that
// names the setting, charged to neither budget; an action on mem:// beside it runs.
func TestFileOutputBaseWithoutAllowedPrefixesFailsAtOnce(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	cfg := testConfig() // storage.allowedPrefixes empty
	run(t, cfg, ns, nil)
	standInKubelet(t, ns)

	tests := []struct {
		name, base string
		want       flytev1.Phase
	}{
		{name: "on-disk", base: "file://" + t.TempDir() + "/r1", want: flytev1.PhaseFailed},
		{name: "in-memory", base: "mem://out/" + ns + "/r1", want: flytev1.PhaseSucceeded},
	}
	for _, tt := range tests {
		ta := containerAction(ns, tt.name, 2)
		ta.Spec.RunOutputBase, ta.Spec.InputURI = tt.base, ""
		if err := env.Client.Create(ctx, ta); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ta flytev1.TaskAction
			key := client.ObjectKey{Namespace: ns, Name: tt.name}
			eventually.True(t, time.Minute, func() bool {
				return env.Client.Get(ctx, key, &ta) == nil && ta.Status.Phase.IsTerminal()
			}, func() string { return fmt.Sprintf("%s did not finish; status %+v", key, ta.Status) })
			if ta.Status.Phase != tt.want {
				t.Fatalf("%s ended %s (error %+v); want %s", key, ta.Status.Phase, ta.Status.Error, tt.want)
			}
			if tt.want != flytev1.PhaseFailed {
				return
			}
			if e := ta.Status.Error; e == nil || !strings.Contains(e.Message, "storage.allowedPrefixes") || !strings.Contains(e.Message, "file://") {
				t.Fatalf("error %+v; want one naming storage.allowedPrefixes and file://", ta.Status.Error)
			}
			if ta.Status.Attempts != 1 || ta.Status.SystemFailures != 0 {
				t.Fatalf("attempts %d, system failures %d; want it refused at the first pass", ta.Status.Attempts, ta.Status.SystemFailures)
			}
			var pods corev1.PodList
			if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				if strings.HasPrefix(p.Name, tt.name+"-") {
					t.Fatalf("pod %s was made for an action that cannot run", p.Name)
				}
			}
		})
	}
}
