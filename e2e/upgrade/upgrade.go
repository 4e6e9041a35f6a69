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
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/test/kubetest"
	internalrelease "github.com/flytekube/backend/test/release"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/systemtest"
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
	if err := kubetest.ApplyCRD(ctx, s.client, old.crd, "upgrade"); err != nil {
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
	plans, err := planWorkload(o.size, s.dataDir, batchUpgrade, 0)
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
	if err := putInFlight(ctx, runCtx, s, plans); err != nil {
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
	rl := &roll{s: s, pr: pr, o: o, tree: tree, ctx: runCtx,
		workloadID: &flytecorev1.ActionIdentifier{Project: project, Domain: domain, Run: runName, Action: plans[0].name}}
	pr.start(runCtx, "kube-apiserver", pr.createRound(s.client, "file://"+filepath.ToSlash(input), s.dataDir))
	for _, svc := range []*service{s.events, s.cache} {
		if err := rl.probeService(svc); err != nil {
			return fail(err)
		}
		if err := rl.probeReplica(svc, old); err != nil {
			return fail(err)
		}
	}
	baseline := time.Now()
	if err := waitFor(ctx, time.Minute, func() (bool, string) {
		for _, t := range rl.targets(old) {
			if n := pr.successes(t, baseline); n < 10 {
				return false, fmt.Sprintf("%s answered every RPC only %d times; see %s", t, n, pr.failures.Name())
			}
		}
		return true, ""
	}); err != nil {
		return fail(fmt.Errorf("before any upgrade, the probe's calls on %s fail: %w", old.name, err))
	}

	step("upgrade the CRD")
	if err := kubetest.ApplyCRD(ctx, s.client, tree.crd, "upgrade"); err != nil {
		return fail(err)
	}
	step("roll the services")
	if err := rl.services(ctx, old, tree); err != nil {
		return fail(err)
	}
	step("roll the executor")
	if err := rl.executor(ctx, old, tree); err != nil {
		return fail(err)
	}
	step("probe the tree")
	if err := rl.probed(ctx, tree); err != nil {
		return fail(err)
	}

	// The reverse, as far as docs/operations.md promises it: the previous release's
	// executor and services back on the tree's schema and CRD, with new work in flight,
	// in the reverse order (the tree's executor calls cache RPCs the previous release's
	// service lacks). The CRD stays the tree's: a later release's CRD only adds.
	step("put work in flight on the tree")
	back := old
	back.name = old.name + "-back"
	more, err := planWorkload(o.size, s.dataDir, batchRollback, o.size.cacheGroups)
	if err != nil {
		return fail(err)
	}
	if err := putInFlight(ctx, runCtx, s, more); err != nil {
		return fail(err)
	}
	plans = append(plans, more...)
	step("roll the executor back")
	if err := rl.executor(ctx, tree, back); err != nil {
		return fail(err)
	}
	step("roll the services back")
	if err := rl.services(ctx, tree, back); err != nil {
		return fail(err)
	}
	step("probe " + back.name)
	if err := rl.probed(ctx, back); err != nil {
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

// putInFlight creates the planned actions and waits until they are in flight: every long
// sleep and long container running and, in each cache group, one action holding the
// reservation (running) while the others wait. Their pods run until runCtx ends.
func putInFlight(ctx, runCtx context.Context, s *system, plans []*plan) error {
	s.runPods(runCtx, plans)
	for _, p := range plans {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.client.Create(cctx, p.action.DeepCopy())
		cancel()
		if err != nil {
			return fmt.Errorf("creating %s: %w", p.name, err)
		}
	}
	return waitFor(ctx, 2*time.Minute, func() (bool, string) { return inFlight(ctx, s, plans) })
}

// roll replaces the programs of one release by another's while the probe calls them.
type roll struct {
	s    *system
	pr   *probe
	o    options
	tree release
	// ctx is the probe's: it ends with the run.
	ctx        context.Context
	workloadID *flytecorev1.ActionIdentifier // an action the probe's reads name
}

// replicaTarget is the probe's name for a service's replica of a release.
func replicaTarget(svc *service, r release) string { return svc.name + "-" + r.name }

// treeTarget is the probe's name for the RPCs the tree added, on its replica.
func treeTarget(svc *service, r release) string { return replicaTarget(svc, r) + " (tree's RPCs)" }

// targets are what the probe calls while release r serves alone.
func (rl *roll) targets(r release) []string {
	return []string{"kube-apiserver", rl.s.events.name, rl.s.cache.name, replicaTarget(rl.s.events, r), replicaTarget(rl.s.cache, r)}
}

// probeService probes a service through its address, whichever replicas serve it.
func (rl *roll) probeService(svc *service) error { return rl.probeAt(svc, svc.name, svc.url()) }

// probeReplica probes release r's replica of a service, and the RPCs the tree added on
// the tree's: the previous release's callers do not use them, and its replicas do not
// serve them.
func (rl *roll) probeReplica(svc *service, r release) error {
	url := "https://" + svc.replicas[r.name].addr
	if err := rl.probeAt(svc, replicaTarget(svc, r), url); err != nil {
		return err
	}
	if r.name != rl.tree.name {
		return nil
	}
	s, pr := rl.s, rl.pr
	if svc == s.cache {
		hc, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ExecutorTokenFile, Timeout: probeCallTimeout})
		if err != nil {
			return err
		}
		pr.start(rl.ctx, treeTarget(svc, r), pr.treeCacheRound(treeTarget(svc, r), cachev1connect.NewCacheServiceClient(hc, url)))
		return nil
	}
	hc, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.OperatorTokenFile, Timeout: probeCallTimeout})
	if err != nil {
		return err
	}
	pr.start(rl.ctx, treeTarget(svc, r), pr.egressRound(treeTarget(svc, r), eventsv1connect.NewEgressServiceClient(hc, url)))
	return nil
}

// probeAt calls every RPC of a service at url, as target.
func (rl *roll) probeAt(svc *service, target, url string) error {
	s, pr := rl.s, rl.pr
	writer, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ExecutorTokenFile, Timeout: probeCallTimeout})
	if err != nil {
		return err
	}
	if svc == s.cache {
		pr.start(rl.ctx, target, pr.cacheRound(target, cachev1connect.NewCacheServiceClient(writer, url)))
		return nil
	}
	reader, err := rpcclient.New(rpcclient.Options{CAFile: s.creds.CAFile, TokenFile: s.creds.ViewerTokenFile})
	if err != nil {
		return err
	}
	wc, rc := newEventsClients(writer, reader, url)
	pr.start(rl.ctx, target, pr.eventsRounds(target, wc, rc, rl.workloadID)...)
	return nil
}

// services rolls both services from one release to another: each new replica is started
// beside the old (a newer one migrates first), both serve side by side for a while, as
// in a rolling update of several replicas, and then the old ones stop.
func (rl *roll) services(ctx context.Context, from, to release) error {
	s, pr := rl.s, rl.pr
	var ready time.Time
	for _, svc := range []*service{s.events, s.cache} {
		began := time.Now()
		if _, err := s.startReplica(ctx, svc, to); err != nil {
			return err
		}
		ready = time.Now()
		rl.o.log("%s of %s ready %s after its start, beside %s's", svc.name, to.name, ready.Sub(began).Round(time.Millisecond), from.name)
		if err := rl.probeReplica(svc, to); err != nil {
			return err
		}
	}
	// Every replica answers (or fails) that many rounds of the probe while both serve.
	sideBySide := []string{replicaTarget(s.events, from), replicaTarget(s.cache, from), replicaTarget(s.events, to), replicaTarget(s.cache, to)}
	if err := waitFor(ctx, time.Duration(rl.o.size.sideBySide)*probeInterval*20+time.Minute, func() (bool, string) {
		for _, t := range sideBySide {
			if n := pr.rounds(t, ready); n < rl.o.size.sideBySide {
				return false, fmt.Sprintf("%s took %d rounds of the probe beside the other release, of %d", t, n, rl.o.size.sideBySide)
			}
		}
		return true, ""
	}); err != nil {
		return err
	}
	for _, svc := range []*service{s.events, s.cache} {
		pr.stop(replicaTarget(svc, from))
		pr.stop(treeTarget(svc, from))
		s.stopReplica(svc, from.name)
		rl.o.log("%s of %s stopped", svc.name, from.name)
	}
	return nil
}

// executor rolls the executor from one release to another: the new one starts as a
// standby and leads once the old one, told to stop, hands over its lease.
func (rl *roll) executor(ctx context.Context, from, to release) error {
	s := rl.s
	if err := s.startExecutor(ctx, to); err != nil {
		return err
	}
	handover := time.Now()
	s.executors[from.name].Stop(30 * time.Second)
	if err := s.waitLeader(ctx, to.name, time.Minute); err != nil {
		return err
	}
	rl.o.log("executor-%s leads, %s after executor-%s was told to stop", to.name, time.Since(handover).Round(time.Millisecond), from.name)
	return nil
}

// probed waits until every target of release r, serving alone, took half as many rounds
// of the probe as the replicas took side by side.
func (rl *roll) probed(ctx context.Context, r release) error {
	after := time.Now()
	want := rl.o.size.sideBySide / 2
	return waitFor(ctx, 2*time.Minute, func() (bool, string) {
		for _, t := range rl.targets(r) {
			if n := rl.pr.rounds(t, after); n < want {
				return false, fmt.Sprintf("%s took %d rounds of the probe with %s alone, of %d", t, n, r.name, want)
			}
		}
		return true, ""
	})
}

// inFlight says whether the planned work is in flight: every long sleep and long
// container running and, in each cache group, one action running.
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
