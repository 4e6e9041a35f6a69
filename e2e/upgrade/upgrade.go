package upgrade

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	internalrelease "github.com/flytekube/backend/internal/release"
	"github.com/flytekube/backend/internal/repo"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/internal/systemtest"
)

// options shape one upgrade test.
type options struct {
	from   string // the release upgraded from: a version in RELEASES, or "latest"
	size   size
	dir    string // files, data and every program's log
	assets string // KUBEBUILDER_ASSETS
	dbURL  string // the services' database, empty
	node   string // where pods run: systemtest.NodeReal, else the stand-in kubelet
	log    func(string, ...any)
}

// result is what an upgrade test found.
type result struct {
	// step is where the test stopped, when it could not go on; problems are the broken
	// promises, each naming its action, event, RPC or program.
	step     string
	problems []string
	figures  []string
}

// stepError is a step the test could not take.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }

// run upgrades a running system from o.from to the tree with work in flight, and checks
// it. An error names the step that could not be taken.
func run(ctx context.Context, o options) (res *result, err error) {
	res = &result{}
	var pr *probe
	step := func(name string) {
		res.step = name
		o.log("== %s", name)
		if pr != nil {
			pr.during(name)
		}
	}
	fail := func(e error) (*result, error) { return res, &stepError{step: res.step, err: e} }
	ctrllog.SetLogger(logr.Discard()) // the test's client retries; its complaints are noise

	step("build the releases")
	root, err := repo.Root()
	if err != nil {
		return fail(err)
	}
	treeBins, err := systemtest.Build(ctx, root, systemtest.BinDir("upgrade"))
	if err != nil {
		return fail(err)
	}
	tree := release{name: "tree", bins: treeBins, crd: filepath.Join(root, "deploy", "crd", "flyte.org_taskactions.yaml"), sinkConfig: true}
	old, err := previous(ctx, root, o.from, tree, o.log)
	if err != nil {
		return fail(err)
	}

	step("start " + old.name)
	s, err := newSystem(ctx, o.dir, o.assets, o.dbURL, o.node, o.log)
	if err != nil {
		return fail(err)
	}
	defer s.stop()
	if err := systemtest.InstallCRD(ctx, s.client, old.crd, "upgrade"); err != nil {
		return fail(err)
	}
	for _, svc := range []*service{s.events, s.cache} {
		if _, err := s.startReplica(ctx, svc, old); err != nil {
			return fail(err)
		}
	}
	if err := s.startExecutor(ctx, old); err != nil {
		return fail(err)
	}
	if err := s.waitLeader(ctx, old.name, time.Minute); err != nil {
		return fail(err)
	}

	if o.size.preload > 0 {
		step("preload the events store")
		hc, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ExecutorTokenFile, Timeout: time.Minute})
		if err != nil {
			return fail(err)
		}
		began := time.Now()
		c := eventsv1connect.NewEventsServiceClient(hc, "https://"+s.events.replicas[old.name].addr)
		if err := preload(ctx, c, o.size.preload); err != nil {
			return fail(err)
		}
		o.log("%d events of another project recorded through %s in %s", o.size.preload, old.name, time.Since(began).Round(time.Second))
	}

	step("put work in flight")
	plans, err := planWorkload(o.size, s.dataDir)
	if err != nil {
		return fail(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopRun()
	watchClient, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ViewerTokenFile})
	if err != nil {
		return fail(err)
	}
	w := newWatcher()
	bg.Go(func() { w.follow(runCtx, watchClient, s.events.url(), project) })
	s.runPods(runCtx, plans)
	for _, p := range plans {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.client.Create(cctx, p.action.DeepCopy())
		cancel()
		if err != nil {
			return fail(fmt.Errorf("creating %s: %w", p.name, err))
		}
	}
	// In flight: every long sleep running, and in each cache group one action holding
	// the reservation (running) while the others wait.
	if err := waitFor(ctx, 2*time.Minute, func() (bool, string) { return inFlight(ctx, s, plans) }); err != nil {
		return fail(err)
	}

	step("probe " + old.name)
	pr, err = newProbe(filepath.Join(s.logs, "probe-failures.log"), o.log)
	if err != nil {
		return fail(err)
	}
	defer pr.wait()
	pr.during(res.step)
	input := filepath.Join(s.dataDir, "inputs", "probe.json")
	if err := os.WriteFile(input, []byte(`{"probe":true}`), 0o644); err != nil {
		return fail(err)
	}
	workloadID := &flytecorev1.ActionIdentifier{Project: project, Domain: domain, Run: runName, Action: plans[0].name}
	probeEvents := func(target, url string) error {
		writer, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ExecutorTokenFile, Timeout: probeCallTimeout})
		if err != nil {
			return err
		}
		reader, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ViewerTokenFile})
		if err != nil {
			return err
		}
		wc, rc := newEventsClients(writer, reader, url)
		pr.start(runCtx, target, pr.eventsRounds(target, wc, rc, workloadID)...)
		return nil
	}
	probeCache := func(target, url string) error {
		hc, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ExecutorTokenFile, Timeout: probeCallTimeout})
		if err != nil {
			return err
		}
		pr.start(runCtx, target, pr.cacheRound(target, cachev1connect.NewCacheServiceClient(hc, url)))
		return nil
	}
	// The RPCs the tree added, on its replicas alone: the previous release's callers do
	// not use them, and its replicas do not serve them.
	probeTreeOnly := func(svc *service, target, url string) error {
		if svc == s.cache {
			hc, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ExecutorTokenFile, Timeout: probeCallTimeout})
			if err != nil {
				return err
			}
			pr.start(runCtx, target, pr.treeCacheRound(target, cachev1connect.NewCacheServiceClient(hc, url)))
			return nil
		}
		hc, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.OperatorTokenFile, Timeout: probeCallTimeout})
		if err != nil {
			return err
		}
		pr.start(runCtx, target, pr.egressRound(target, eventsv1connect.NewEgressServiceClient(hc, url)))
		return nil
	}
	replicaTarget := func(svc *service, r release) string { return svc.name + "-" + r.name }
	pr.start(runCtx, "kube-apiserver", pr.createRound(s.client, "file://"+filepath.ToSlash(input), s.dataDir))
	for _, t := range []struct {
		target, url string
		probe       func(string, string) error
	}{
		{"events", s.events.url(), probeEvents},
		{replicaTarget(s.events, old), "https://" + s.events.replicas[old.name].addr, probeEvents},
		{"cacheservice", s.cache.url(), probeCache},
		{replicaTarget(s.cache, old), "https://" + s.cache.replicas[old.name].addr, probeCache},
	} {
		if err := t.probe(t.target, t.url); err != nil {
			return fail(err)
		}
	}
	baseline := time.Now()
	targets := []string{"kube-apiserver", "events", "cacheservice", replicaTarget(s.events, old), replicaTarget(s.cache, old)}
	if err := waitFor(ctx, time.Minute, func() (bool, string) {
		for _, t := range targets {
			if n := pr.successes(t, baseline); n < 10 {
				return false, fmt.Sprintf("%s answered every RPC only %d times; see %s", t, n, pr.failures.Name())
			}
		}
		return true, ""
	}); err != nil {
		return fail(fmt.Errorf("before any upgrade, the probe's calls on %s fail: %w", old.name, err))
	}

	step("upgrade the CRD")
	if err := systemtest.InstallCRD(ctx, s.client, tree.crd, "upgrade"); err != nil {
		return fail(err)
	}

	step("roll the services")
	var ready time.Time
	for _, svc := range []*service{s.events, s.cache} {
		began := time.Now()
		rep, err := s.startReplica(ctx, svc, tree)
		if err != nil {
			return fail(err)
		}
		ready = time.Now()
		o.log("%s of the tree ready (migrated) %s after its start, beside %s's", svc.name, ready.Sub(began).Round(time.Millisecond), old.name)
		probe := probeEvents
		if svc == s.cache {
			probe = probeCache
		}
		if err := probe(replicaTarget(svc, tree), "https://"+rep.addr); err != nil {
			return fail(err)
		}
		if err := probeTreeOnly(svc, replicaTarget(svc, tree)+" (tree's RPCs)", "https://"+rep.addr); err != nil {
			return fail(err)
		}
	}
	// Old and new replicas serve side by side for a while, as in a rolling update of
	// several replicas; every replica answers (or fails) that many rounds of the probe.
	sideBySide := []string{replicaTarget(s.events, old), replicaTarget(s.cache, old), replicaTarget(s.events, tree), replicaTarget(s.cache, tree)}
	if err := waitFor(ctx, time.Duration(o.size.sideBySide)*probeInterval*20+time.Minute, func() (bool, string) {
		for _, t := range sideBySide {
			if n := pr.rounds(t, ready); n < o.size.sideBySide {
				return false, fmt.Sprintf("%s took %d rounds of the probe beside the other release, of %d", t, n, o.size.sideBySide)
			}
		}
		return true, ""
	}); err != nil {
		return fail(err)
	}
	for _, svc := range []*service{s.events, s.cache} {
		pr.stop(replicaTarget(svc, old))
		s.stopReplica(svc, old.name)
		o.log("%s of %s stopped", svc.name, old.name)
	}

	step("roll the executor")
	if err := s.startExecutor(ctx, tree); err != nil {
		return fail(err)
	}
	handover := time.Now()
	s.executors[old.name].Stop(30 * time.Second)
	if err := s.waitLeader(ctx, tree.name, time.Minute); err != nil {
		return fail(err)
	}
	o.log("the tree's executor leads, %s after the old one was told to stop", time.Since(handover).Round(time.Millisecond))

	step("probe the tree")
	after := time.Now()
	targets = []string{"kube-apiserver", "events", "cacheservice", replicaTarget(s.events, tree), replicaTarget(s.cache, tree)}
	if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
		for _, t := range targets {
			if n := pr.rounds(t, after); n < o.size.sideBySide/2 {
				return false, fmt.Sprintf("%s took %d rounds of the probe after the upgrade, of %d", t, n, o.size.sideBySide/2)
			}
		}
		return true, ""
	}); err != nil {
		return fail(err)
	}
	pr.wait()

	step("settle and check")
	ch, err := newChecker(s, plans, pr, w)
	if err != nil {
		return fail(err)
	}
	res.problems = ch.settle(ctx, o.size.settle)
	res.figures = append(res.figures, ch.figures()...)
	lines, _ := pr.report()
	res.figures = append(res.figures, lines...)
	return res, nil
}

// inFlight says whether the work is in flight: every long sleep and long container
// running and, in each cache group, one action running.
func inFlight(ctx context.Context, s *system, plans []*plan) (bool, string) {
	var list flytev1.TaskActionList
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.client.List(lctx, &list); err != nil {
		return false, err.Error()
	}
	phase := map[string]flytev1.Phase{}
	for _, ta := range list.Items {
		phase[ta.Name] = ta.Status.Phase
	}
	running := map[int]bool{}
	for _, p := range plans {
		switch {
		case (p.kind == kindLongSleep || p.kind == kindContainerLong) && phase[p.name] != flytev1.PhaseRunning:
			return false, fmt.Sprintf("%s is %q, not yet Running", p.name, phase[p.name])
		case p.kind == kindCachedSleep && phase[p.name] == flytev1.PhaseRunning:
			running[p.group] = true
		}
	}
	for _, p := range plans {
		if p.kind == kindCachedSleep && !running[p.group] {
			return false, fmt.Sprintf("no action of cache group %d runs yet", p.group)
		}
	}
	return true, ""
}

// waitFor polls cond until it holds, or fails after timeout with what cond last said.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not within %s: %s", timeout, why)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

func cacheDir() string {
	d, err := internalrelease.CacheDir()
	if err != nil {
		return "?"
	}
	return d
}

// pods are the test's namespace's pods now, for the stand-in kubelet; none while the API
// server does not answer.
func pods(ctx context.Context, s *system) []*corev1.Pod {
	var list corev1.PodList
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.client.List(lctx, &list, client.InNamespace(namespace)); err != nil {
		return nil
	}
	out := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out
}

// fromTree is the "release" that is the tree itself: upgraded to itself, the test is a
// rolling restart of every program, a control of the test's own soundness (what it finds
// then is the tree's, not an upgrade's).
const fromTree = "tree"

// previous is the release upgraded from: the one RELEASES names (built from its commit,
// once), or the tree itself.
func previous(ctx context.Context, root, from string, tree release, log func(string, ...any)) (release, error) {
	if from == fromTree {
		return release{name: "tree-before", bins: tree.bins, crd: tree.crd, sinkConfig: true}, nil
	}
	rel, err := internalrelease.Find(root, from)
	if err != nil {
		return release{}, err
	}
	log("building %s from %s (the first time takes minutes; cached in %s)", rel.Version, rel.Commit[:12], cacheDir())
	b, err := internalrelease.Get(ctx, root, rel)
	if err != nil {
		return release{}, err
	}
	flags, err := os.ReadFile(filepath.Join(b.Source, "events", "flags.go"))
	if err != nil {
		return release{}, fmt.Errorf("reading %s's events flags: %w", rel.Version, err)
	}
	old := release{name: rel.Version, bins: map[string]string{}, crd: filepath.Join(b.Source, "deploy", "crd", "flyte.org_taskactions.yaml"),
		sinkConfig: strings.Contains(string(flags), `"cloudevents-config"`)}
	for name := range internalrelease.Programs {
		old.bins[name] = b.Binary(name)
	}
	return old, nil
}

// preloadProject holds the events that make the store as large as a cluster's: the
// migrations then take what they take there, while the previous release serves.
const preloadProject = "preload"

// preload records n events (four phases of n/4 actions, a thousand a call) in
// preloadProject.
func preload(ctx context.Context, c eventsv1connect.EventsServiceClient, n int) error {
	phases := []flytecorev1.ActionPhase{flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING,
		flytecorev1.ActionPhase_ACTION_PHASE_RUNNING, flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED}
	now := timestamppb.Now()
	for action := 0; action*len(phases) < n; {
		var batch []*eventsv1.ActionEvent
		for ; len(batch)+len(phases) <= 1000 && action*len(phases) < n; action++ {
			id := &flytecorev1.ActionIdentifier{Project: preloadProject, Domain: domain, Run: "preload", Action: fmt.Sprintf("a%07d", action)}
			for _, ph := range phases {
				batch = append(batch, &eventsv1.ActionEvent{Id: id, Attempt: 1, Phase: ph, OccurredAt: now, ReportedAt: now, Cluster: "upgrade", TaskType: "preload"})
			}
		}
		if _, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: batch})); err != nil {
			return fmt.Errorf("preloading the events store: %w", err)
		}
	}
	return nil
}
