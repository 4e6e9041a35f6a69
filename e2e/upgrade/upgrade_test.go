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

	cachestore "github.com/flytekube/backend/cacheservice/store"
	eventsstore "github.com/flytekube/backend/events/store"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/pgtest"
	internalrelease "github.com/flytekube/backend/test/release"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/systemtest"
)

// TestUpgrade upgrades each release UPGRADE_FROM names to the tree with work in flight,
// and rolls it back (doc.go), one subtest a release.
//
// UPGRADE_TEST chooses the form: "short" or unset (few actions, short sleeps: about a
// minute a release, part of make test), "full" (make upgrade-test: more and longer work),
// or "off", which skips it. UPGRADE_FROM lists the releases upgraded from, separated by
// spaces: versions of RELEASES, "first" and "latest" for its first and last lines (the
// default is both: the first release is the oldest an upgrade to the tree is promised
// from, the latest the usual one), or "tree" for the tree upgraded to itself, a rolling
// restart that checks the test itself. UPGRADE_NODE says where the container actions'
// pods run: "stand-in" or unset (the stand-in kubelet, which runs nothing), or "real"
// (containerd, a kubelet and kube-scheduler from hack/node.sh; as root).
func TestUpgrade(t *testing.T) {
	form := os.Getenv("UPGRADE_TEST")
	var sz size
	switch form {
	case "", "short":
		form, sz = "short", shortForm
	case "full":
		sz = fullForm
	case "off":
		t.Skip("UPGRADE_TEST=off")
	default:
		t.Fatalf("UPGRADE_TEST=%q: want short, full or off", form)
	}
	froms, err := releasesFrom(os.Getenv("UPGRADE_FROM"))
	if err != nil {
		t.Fatal(err)
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
	pg := pgtest.New(t)
	for _, from := range froms {
		t.Run(from, func(t *testing.T) { upgradeFrom(t, from, form, node, sz, assets, pg.NewDatabase(t)) })
	}
}

// releasesFrom resolves UPGRADE_FROM to versions, each once: by default the oldest
// release the tree upgrades from and the latest.
func releasesFrom(env string) ([]string, error) {
	names := strings.Fields(env)
	if len(names) == 0 {
		names = []string{"oldest", "latest"}
	}
	root, err := repo.Root()
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, name := range names {
		version := name
		if name == "oldest" {
			rel, err := oldestUpgradable(root)
			if err != nil {
				return nil, fmt.Errorf("UPGRADE_FROM: %w", err)
			}
			version = rel.Version
		} else if name != fromTree {
			rel, err := internalrelease.Find(root, name)
			if err != nil {
				return nil, fmt.Errorf("UPGRADE_FROM: %w", err)
			}
			version = rel.Version
		}
		if !seen[version] {
			seen[version] = true
			out = append(out, version)
		}
	}
	return out, nil
}

// upgradeFrom runs one upgrade test, from release from, with pods on node, on the empty
// database dbURL.
func upgradeFrom(t *testing.T, from, form, node string, sz size, assets, dbURL string) {
	// Short, as the soak's: the API server's and the services' paths stay short.
	dir, err := os.MkdirTemp("", "upgrade-")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	t.Logf("upgrade from %s to the tree and back, %s form, pods on the %s node; files and logs in %s", from, form, cmp.Or(node, systemtest.NodeStandIn), dir)
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
		t.Fatalf("the upgrade from %s to the tree and back broke %d promises, in %d kinds (each with its count and first instance; all in %s):\n  %s\nlogs in %s (the probe's failures, each with its time, in probe-failures.log)",
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

// stores are the services' migrations, by the directory that holds them.
var stores = map[string]postgres.Migrations{
	"events/store/migrations":       eventsstore.Migrations(),
	"cacheservice/store/migrations": cachestore.Migrations(),
}

// oldestUpgradable is the oldest release in RELEASES that the tree upgrades from in
// place: whose code works with the schema the tree's migrations leave (the tree's
// contracts say from which version on, postgres.OldestCompatibleCode), so that its
// replicas serve beside the tree's during the rollout and after a rollback. An older
// release upgrades through the ones between.
func oldestUpgradable(root string) (internalrelease.Release, error) {
	all, err := internalrelease.Load(root)
	if err != nil {
		return internalrelease.Release{}, err
	}
	for _, rel := range all {
		ok := true
		for dir, m := range stores {
			oldest, err := postgres.OldestCompatibleCode(m)
			if err != nil {
				return internalrelease.Release{}, err
			}
			newest, err := rel.NewestMigration(root, dir)
			if err != nil {
				return internalrelease.Release{}, err
			}
			ok = ok && newest >= oldest
		}
		if ok {
			return rel, nil
		}
	}
	return internalrelease.Release{}, errors.New("no release in RELEASES works with the tree's schema: the tree upgrades from none in place")
}
