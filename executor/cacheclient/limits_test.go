package cacheclient_test

import (
	"context"
	"os"
	"strings"
	"testing"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/cacheclient"
	"github.com/flytekube/backend/executor/datastore"
)

// limitedEnv is newEnv with a data store of small limits.
func limitedEnv(t *testing.T, limits datastore.Limits) *env {
	t.Helper()
	e := newEnv(t)
	store, err := datastore.Confine(datastore.NewLimited(limits), []string{"file://" + e.dir + "/projects/{project}/{domain}"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	e.store = store
	return e
}

// TestHitsAreCopiedStreamedWithinTheCopyLimit: a hit's outputs are copied without being
// held, so outputs larger than a document the store reads are copied whole; outputs over
// the copy limit make the hit a miss, and the action runs.
func TestHitsAreCopiedStreamedWithinTheCopyLimit(t *testing.T) {
	e := limitedEnv(t, datastore.Limits{MaxDocumentBytes: 1024, MaxCopyBytes: 8192})
	ctx := context.Background()
	cc := e.cache(t)
	for _, tt := range []struct {
		name string
		size int
		hit  bool
	}{{"larger-than-a-document", 5000, true}, {"over-the-copy-limit", 9000, false}} {
		t.Run(tt.name, func(t *testing.T) {
			inputs := e.uri(tt.name + "/inputs.json")
			e.write(t, inputs, `{"x": 6}`)
			a, b := e.action(tt.name+"-a", inputs), e.action(tt.name+"-b", inputs)
			a.Spec.TaskName = tt.name // one cache key per case
			b.Spec.TaskName = a.Spec.TaskName
			outA, outB := e.uri(tt.name+"/a/outputs.json"), e.uri(tt.name+"/b/outputs.json")
			cc.Lookup(ctx, a, outA)
			outputs := strings.Repeat(" ", tt.size-2) + "{}"
			e.write(t, outA, outputs)
			if got := cc.Store(ctx, a, outA); got != flytev1.CachePopulated {
				t.Fatalf("storing A's outputs: %s", got)
			}
			d := cc.Lookup(ctx, b, outB)
			if d.Hit != tt.hit {
				t.Fatalf("B's lookup = %+v; want hit %v", d, tt.hit)
			}
			got, err := os.ReadFile(strings.TrimPrefix(outB, "file://"))
			switch {
			case tt.hit && (err != nil || string(got) != outputs):
				t.Fatalf("B's outputs hold %d bytes, %v; want A's %d", len(got), err, len(outputs))
			case !tt.hit && !os.IsNotExist(err):
				t.Fatalf("a refused hit left B's outputs: %d bytes, %v", len(got), err)
			case !tt.hit:
				cc.Release(ctx, b)
			}
		})
	}
}

// TestInputsHashIsUnchanged pins the inputs' hash of a document: cache keys computed
// before an upgrade must still be found after it.
func TestInputsHashIsUnchanged(t *testing.T) {
	e := newEnv(t)
	inputs := e.uri("inputs.json")
	e.write(t, inputs, `{"b": {"z": 1, "a": [1, 2.50, "<x>"]}, "a": "é", "seed": 7}`)
	ta := e.action("a", inputs)
	ta.Spec.Cache.IgnoredInputs = []string{"seed"}
	key, err := e.cache(t).Key(context.Background(), ta)
	if err != nil {
		t.Fatal(err)
	}
	const want = "b7aa361da116a5ee5d58193f7cd7e189996d62149a6b9529d895b01d401b387f"
	if key.InputsHash != want {
		t.Fatalf("inputs hash %s; want %s", key.InputsHash, want)
	}
	if h, err := cacheclient.InputsHash([]byte(`{"a":"é","b":{"a":[1,2.5,"<x>"],"z":1}}`), nil); err != nil || h != want {
		t.Fatalf("the same document written otherwise hashes to %s, %v; want %s", h, err, want)
	}
}
