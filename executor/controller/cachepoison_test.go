package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/datastore"
	"github.com/flytekube/backend/executor/storage"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/internal/rpcclient"
)

// TestForgedCacheEntriesAreMisses plays an attacker who can write the cache service (as
// anyone who reached it could before it checked callers): an entry under an action's
// own key names, as its outputs, a file of the executor's own or another project's or
// domain's outputs. The action must count a miss, run, and its outputs must hold its
// own result, never what the entry pointed at; then its success replaces the entry.
func TestForgedCacheEntriesAreMisses(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)

	// The executor's secret, outside every allowed prefix, and a way to it from inside.
	secretDir := t.TempDir()
	const secret = "executor-serviceaccount-token"
	token := filepath.Join(secretDir, "token")
	if err := os.WriteFile(token, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dataDir, ns), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secretDir, filepath.Join(dataDir, ns, "link")); err != nil {
		t.Fatal(err)
	}
	up, err := filepath.Rel(filepath.Join(dataDir, ns), token)
	if err != nil {
		t.Fatal(err)
	}
	// Other projects' and domains' outputs, in their parts of the allowed prefix.
	theirs := func(project, domain string) string {
		path := filepath.Join(dataDir, "projects", project, domain, ns, "a0", "1", "outputs.json")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(`{"secret": "`+secret+` of `+project+`/`+domain+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		return "file://" + path
	}

	tests := []struct {
		name, outputURI, reason string
	}{
		{"executors-own-file", "file://" + token, storage.ReasonOutside},
		{"dot-dot", "file://" + filepath.Join(dataDir, ns) + "/" + strings.ReplaceAll(up, "..", "%2e%2e"), storage.ReasonOutside},
		{"symlink", "file://" + filepath.Join(dataDir, ns, "link", "token"), storage.ReasonSymlink},
		{"other-project", theirs("other", "development"), storage.ReasonOtherProject},
		{"other-domain", theirs("demo", "production"), storage.ReasonOtherProject},
	}
	cacheClient := cacheServiceClient(t)
	keys := cacheclient.New(nil, datastore.New(), cacheclient.Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inputs := `{"case": "` + tt.name + `"}`
			ta := cachedAction(t, ns, tt.name, inputs, false, nil)
			key, err := keys.Key(ctx, ta)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cacheClient.Put(ctx, connect.NewRequest(&cachev1.PutRequest{
				Key: key, OutputUri: tt.outputURI, SourceAttempt: 1, Overwrite: true,
				SourceAction: &flytecorev1.ActionIdentifier{Project: "demo", Domain: "development", Run: "attacker", Action: "a0"},
			}))
			if err != nil {
				t.Fatalf("forging the entry: %v", err)
			}
			misses, refused := counter(t, "flyte_executor_cache_lookups_total", "result", "miss"),
				counter(t, "flyte_executor_cache_outputs_refused_total", "reason", tt.reason)

			create(t, ta)
			got := waitFor(t, ta, "finished", terminal)
			if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.CacheStatus != flytev1.CachePopulated ||
				!slices.Contains(calls.get(ta.Name), "handle:1") || strings.Contains(history(got), "CacheHit") {
				t.Fatalf("%s, cache %s, calls %v, history %s; want a miss that ran and populated the cache",
					got.Status.Phase, got.Status.CacheStatus, calls.get(ta.Name), history(got))
			}
			out, err := os.ReadFile(filepath.Join(dataDir, ns, tt.name, tt.name, "1", "outputs.json"))
			if err != nil || string(out) != inputs {
				t.Fatalf("outputs %q, %v; want the action's own (its inputs, echoed)", out, err)
			}
			if after := counter(t, "flyte_executor_cache_lookups_total", "result", "miss"); after < misses+1 {
				t.Errorf("cache misses went from %v to %v; want the lookup counted as a miss", misses, after)
			}
			if after := counter(t, "flyte_executor_cache_outputs_refused_total", "reason", tt.reason); after != refused+1 {
				t.Errorf("refused outputs (%s) went from %v to %v; want one more", tt.reason, refused, after)
			}

			// The action's success replaced the forged entry.
			entry, err := cacheClient.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: key}))
			if err != nil || entry.Msg.GetOutput().GetOutputUri() != got.Status.OutputsURI {
				t.Fatalf("the entry afterwards: %v, %v; want the action's own outputs %s", entry, err, got.Status.OutputsURI)
			}
		})
	}
	if got, _ := os.ReadFile(token); string(got) != secret {
		t.Fatalf("the secret was changed: %q", got)
	}
}

func cacheServiceClient(t *testing.T) cachev1connect.CacheServiceClient {
	t.Helper()
	c, err := cacheclient.NewClient(cacheURL, rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// counter reads a counter of the executor's metrics (0 when absent).
func counter(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
