package server_test

import (
	"math/rand/v2"
	"testing"

	"buf.build/go/protovalidate"
	"k8s.io/apimachinery/pkg/util/validation"

	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

// The contracts spell the DNS-1123 label rule as a pattern RE2 matches in one pass. This
// checks that it accepts exactly what Kubernetes accepts, on hand-picked names and on
// random strings over the characters that matter.
func TestNameRuleIsKubernetesDNSLabel(t *testing.T) {
	names := []string{
		"", "a", "0", "-", "a-", "-a", "a-b", "a--b", "a---b-c", "ab-", "A", "aB", "a_b", "a.b",
		"r1", "demo", "development", "x-r17", "a b", "é", "a\n",
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabc",  // 63
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcd", // 64
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ab09--A_."
	for range 5000 {
		b := make([]byte, rnd.IntN(8))
		for i := range b {
			b[i] = alphabet[rnd.IntN(len(alphabet))]
		}
		names = append(names, string(b))
	}
	for _, name := range names {
		want := len(validation.IsDNS1123Label(name)) == 0
		id := &flytecorev1.ActionIdentifier{Project: name, Domain: "d", Run: "r", Action: "a"}
		if got := protovalidate.Validate(id) == nil; got != want {
			t.Errorf("ActionIdentifier.project %q: valid %v, Kubernetes says %v", name, got, want)
		}
		key := &cachev1.CacheKey{Project: name, Domain: "d", TaskName: "t", CacheVersion: "1", Signature: "s", InputsHash: "h"}
		if got := protovalidate.Validate(key) == nil; got != want {
			t.Errorf("CacheKey.project %q: valid %v, Kubernetes says %v", name, got, want)
		}
	}
}
