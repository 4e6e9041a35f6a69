package upgrade

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/internal/kubetest"
	"github.com/flytekube/backend/internal/pgtest"
	"github.com/flytekube/backend/internal/systemtest"
)

// TestUpgrade upgrades the previous release to the tree with work in flight (doc.go).
//
// UPGRADE_TEST chooses the form: "short" or unset (few actions, short sleeps: about a
// minute, part of make test), "full" (make upgrade-test: more and longer work), or "off",
// which skips it. UPGRADE_FROM names the release upgraded from (default: the
// last line of RELEASES), or "tree" for the tree upgraded to itself, a rolling restart
// that checks the test itself. UPGRADE_NODE says where the container actions' pods run:
// "stand-in" or unset (the stand-in kubelet, which runs nothing), or "real" (containerd,
// a kubelet and kube-scheduler from hack/node.sh; as root).
func TestUpgrade(t *testing.T) {
	form := os.Getenv("UPGRADE_TEST")
	var sz size
	switch form {
	case "", "short":
		sz = shortForm
	case "full":
		sz = fullForm
	case "off":
		t.Skip("UPGRADE_TEST=off")
	default:
		t.Fatalf("UPGRADE_TEST=%q: want short, full or off", form)
	}
	from := os.Getenv("UPGRADE_FROM")
	if from == "" {
		from = "latest"
	}
	node := os.Getenv("UPGRADE_NODE")
	switch node {
	case "", systemtest.NodeStandIn:
	case systemtest.NodeReal:
		if os.Geteuid() != 0 {
			t.Fatal("UPGRADE_NODE=real: a real node needs root (containerd, kubelet)")
		}
	default:
		t.Fatalf("UPGRADE_NODE=%q: want %s or %s", node, systemtest.NodeReal, systemtest.NodeStandIn)
	}
	assets, err := kubetest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	// Short, as the soak's: the API server's and the services' paths stay short.
	dir, err := os.MkdirTemp("", "upgrade-")
	if err != nil {
		t.Fatal(err)
	}
	dbURL := pgtest.New(t).NewDatabase(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	t.Logf("upgrade from %s to the tree, %s form, pods on the %s node; files and logs in %s", from, cmp.Or(form, "short"), cmp.Or(node, systemtest.NodeStandIn), dir)
	res, err := run(ctx, options{from: from, size: sz, dir: dir, assets: assets, dbURL: dbURL, node: node,
		log: func(format string, args ...any) {
			t.Logf("%6.1fs "+format, append([]any{time.Since(began).Seconds()}, args...)...)
		}})
	logs := filepath.Join(dir, "logs")
	if err != nil {
		var se *stepError
		if errors.As(err, &se) {
			t.Fatalf("the upgrade from %s stopped at step %q: %v\nlogs in %s", from, se.step, se.err, logs)
		}
		t.Fatalf("the upgrade from %s: %v\nlogs in %s", from, err, logs)
	}
	t.Logf("figures:\n  %s", strings.Join(res.figures, "\n  "))
	if len(res.problems) > 0 {
		all := filepath.Join(logs, "problems.txt")
		_ = os.WriteFile(all, []byte(strings.Join(res.problems, "\n")+"\n"), 0o644)
		t.Fatalf("the upgrade from %s to the tree broke %d promises, in %d kinds (each with its count and first instance; all in %s):\n  %s\nlogs in %s (the probe's failures, each with its time, in probe-failures.log)",
			from, len(res.problems), len(summarize(res.problems)), all, strings.Join(summarize(res.problems), "\n  "), logs)
	}
	_ = os.RemoveAll(dir)
}

// summarize groups problems that differ only in their numbers (action names, counts,
// times), each group as its count and first instance, largest first.
func summarize(problems []string) []string {
	digits := regexp.MustCompile(`[0-9]+`)
	count := map[string]int{}
	first := map[string]string{}
	var order []string
	for _, p := range problems {
		k := digits.ReplaceAllString(p, "N")
		if count[k] == 0 {
			first[k] = p
			order = append(order, k)
		}
		count[k]++
	}
	sort.SliceStable(order, func(i, j int) bool { return count[order[i]] > count[order[j]] })
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, fmt.Sprintf("%dx %s", count[k], first[k]))
	}
	return out
}
