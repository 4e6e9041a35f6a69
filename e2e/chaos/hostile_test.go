package chaos

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestHostilePlans: whatever the duration, a seed plans every hostile kind, the same
// plans each time; forgers name a chaos action the client keeps, with project chaos,
// and live in namespace hostile like the rest.
func TestHostilePlans(t *testing.T) {
	for _, d := range []time.Duration{30 * time.Second, 5 * time.Minute} {
		t.Run(d.String(), func(t *testing.T) {
			dir := t.TempDir()
			plan := func() ([]*plan, *workload) {
				for _, sub := range []string{"inputs", "outputs"} {
					if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				w, err := planWorkload(rand.New(rand.NewPCG(7, 1)), d, dir, "busybox")
				if err != nil {
					t.Fatal(err)
				}
				h, err := planHostile(rand.New(rand.NewPCG(7, 3)), d, w.plans, dir, "busybox")
				if err != nil {
					t.Fatal(err)
				}
				return h, w
			}
			h, w := plan()
			again, _ := plan()
			kinds := map[string]int{}
			for i, p := range h {
				kinds[p.kind]++
				if p.action.Namespace != hostileNamespace || !p.hostile || p.code == "" || p.at < 0 || p.at >= d {
					t.Errorf("%s: namespace %s, hostile %v, code %q, at %s", p.name, p.action.Namespace, p.hostile, p.code, p.at)
				}
				if got, want := p.action.Spec.Project, hostileProject; forged(p.kind) {
					if got != "chaos" {
						t.Errorf("%s: project %s; a forger names chaos", p.name, got)
					}
				} else if got != want {
					t.Errorf("%s: project %s, want %s", p.name, got, want)
				}
				if p.kind == kindForgeEcho || p.kind == kindForgeWrite {
					v := w.byName[p.victim]
					if v == nil || v.hostile || v.deletion != keep || p.action.Spec.ActionName != v.name || p.action.Spec.RunOutputBase != v.action.Spec.RunOutputBase {
						t.Errorf("%s: victim %q; want a kept chaos action whose name and output base it takes", p.name, p.victim)
					}
				}
				if p.name != again[i].name || p.at != again[i].at || p.victim != again[i].victim || !reflect.DeepEqual(p.action.Spec, again[i].action.Spec) {
					t.Errorf("%s: planned differently from the same seed: %s", p.name, again[i].name)
				}
			}
			for _, k := range hostileKinds {
				if kinds[k] == 0 {
					t.Errorf("no %s planned in %d hostile actions", k, len(h))
				}
			}
		})
	}
}
