package upgrade

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// The test's tenant: its namespace is named after its project, which every release
// accepts (the tree ties projects to namespaces; v0.1.0 did not: docs/operations.md).
const (
	namespace = "upgrade"
	project   = "upgrade"
	domain    = "development"
	runName   = "upgrade"
	// probeRun is the run of the actions the probe creates; recordRun the run of the
	// events the probe records itself.
	probeRun  = "probe"
	recordRun = "probe-records"
)

// Kinds of planned action.
const (
	kindLongSleep   = "long-sleep"   // core-sleep across the whole upgrade
	kindSleep       = "sleep"        // a short core-sleep
	kindRetryOK     = "retry-ok"     // fails its first attempt, succeeds on its retry
	kindRetryKO     = "retry-ko"     // fails every attempt: Failed after its retry
	kindEcho        = "echo"         // core-echo
	kindCachedSleep = "cached-sleep" // cacheable, serializable, keys shared: one holds the reservation, the others wait
	// Container actions, on the stand-in kubelet (systemtest.Kubelet) or a real node
	// (UPGRADE_NODE=real), whose containers do as their kind says.
	kindContainerLong  = "container-long"  // a pod running across the whole upgrade
	kindContainerOK    = "container-ok"    // a pod that exits 0
	kindContainerKO    = "container-ko"    // a pod that exits 1, no retries: the action fails
	kindContainerFlaky = "container-flaky" // its first pod exits 1, its retry's 0
)

// The batches of planned work: one put in flight before the upgrade, one before the
// rollback; an action's name begins with its batch.
const (
	batchUpgrade  = "w"
	batchRollback = "r"
)

// plan is one action put in flight before the upgrade or the rollback.
type plan struct {
	name, kind string
	group      int           // the cache group of a cached-sleep
	run        time.Duration // how long a container action's container runs
	expect     flytev1.Phase
	action     *flytev1.TaskAction
}

// size is how much work a form of the test puts in flight.
type size struct {
	longSleeps, sleeps, retries, echoes int
	containers                          int           // of each container kind
	longSleep                           time.Duration // each long sleep's, the first's; later ones grow
	cacheGroups, perGroup               int
	cachedSleep                         time.Duration
	// sideBySide is how many probe rounds each old and new replica of a service must
	// answer, or fail, while both serve, before the old is stopped: a rolling update of
	// several replicas serves old and new together for a while.
	sideBySide int
	settle     time.Duration // the most the system may take to finish what it owes
	// preload is how many events of another project the store holds before the
	// upgrade, so that the migrations take what they take in a cluster's store.
	preload int
}

var (
	shortForm = size{longSleeps: 2, sleeps: 2, retries: 1, echoes: 1, containers: 1, longSleep: 20 * time.Second,
		cacheGroups: 2, perGroup: 3, cachedSleep: 15 * time.Second, sideBySide: 50, settle: 2 * time.Minute}
	fullForm = size{longSleeps: 10, sleeps: 20, retries: 10, echoes: 10, containers: 5, longSleep: 30 * time.Second,
		cacheGroups: 4, perGroup: 5, cachedSleep: 30 * time.Second, sideBySide: 300, settle: 5 * time.Minute, preload: 2_000_000}
)

// planWorkload writes the inputs of one batch of work and returns its actions; its cache
// groups are numbered from firstGroup, so that no two batches share one.
func planWorkload(sz size, dataDir, batch string, firstGroup int) ([]*plan, error) {
	var plans []*plan
	add := func(kind string, group int, spec flytev1.TaskActionSpec, expect flytev1.Phase) error {
		name := fmt.Sprintf("%s%03d-%s", batch, len(plans), kind)
		spec.Project, spec.Domain, spec.RunName, spec.ActionName = project, domain, runName, name
		if spec.TaskName == "" {
			spec.TaskName = "upgrade." + kind
		}
		if spec.RunOutputBase == "" {
			spec.RunOutputBase = fileURI(dataDir, "outputs", name)
		}
		if spec.InputURI == "" {
			in := filepath.Join(dataDir, "inputs", name+".json")
			if err := os.WriteFile(in, fmt.Appendf(nil, `{"n":%d}`, len(plans)), 0o644); err != nil {
				return fmt.Errorf("workload: %w", err)
			}
			spec.InputURI = fileURI(dataDir, "inputs", name+".json")
		}
		plans = append(plans, &plan{name: name, kind: kind, group: group, expect: expect,
			action: &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: spec}})
		return nil
	}
	sleep := func(d time.Duration) map[string]string { return map[string]string{"duration": d.String()} }
	for i := range sz.longSleeps {
		// Spread over 1 to 2 times the first, so that they end at different points of the
		// upgrade and after it.
		d := sz.longSleep + time.Duration(i)*sz.longSleep/time.Duration(max(sz.longSleeps, 1))
		if err := add(kindLongSleep, 0, flytev1.TaskActionSpec{TaskType: "core-sleep", Config: sleep(d)}, flytev1.PhaseSucceeded); err != nil {
			return nil, err
		}
	}
	for i := range sz.sleeps {
		if err := add(kindSleep, 0, flytev1.TaskActionSpec{TaskType: "core-sleep", Config: sleep(time.Duration(200+100*i) * time.Millisecond)}, flytev1.PhaseSucceeded); err != nil {
			return nil, err
		}
	}
	for range sz.retries {
		ok := map[string]string{"duration": "500ms", "failAttempts": "1"}
		if err := add(kindRetryOK, 0, flytev1.TaskActionSpec{TaskType: "core-sleep", Config: ok, Retries: 1}, flytev1.PhaseSucceeded); err != nil {
			return nil, err
		}
		ko := map[string]string{"duration": "300ms", "failAttempts": "5"}
		if err := add(kindRetryKO, 0, flytev1.TaskActionSpec{TaskType: "core-sleep", Config: ko, Retries: 1}, flytev1.PhaseFailed); err != nil {
			return nil, err
		}
	}
	for range sz.echoes {
		if err := add(kindEcho, 0, flytev1.TaskActionSpec{TaskType: "core-echo"}, flytev1.PhaseSucceeded); err != nil {
			return nil, err
		}
	}
	for range sz.containers {
		for _, kind := range []string{kindContainerLong, kindContainerOK, kindContainerKO, kindContainerFlaky} {
			// On a real node the container itself does what its kind says, for about as long
			// as the stand-in runs it, and ends on SIGTERM as the stand-in's do (sh as PID 1
			// would ignore it). The image is the node's, set when the pods start (runPods).
			run := time.Second
			if kind == kindContainerLong {
				run = sz.longSleep
			}
			spec := flytev1.TaskActionSpec{TaskType: "container", Container: &flytev1.ContainerSpec{Image: "busybox:1.36",
				Command: []string{"sh", "-c", fmt.Sprintf(`trap 'exit 143' TERM; sleep %d & wait; [ "$%s" -gt %d ]`,
					int((run+time.Second-1)/time.Second), flytek8s.EnvAttempt, failedAttempts(kind))}}}
			expect := flytev1.PhaseSucceeded
			switch kind {
			case kindContainerKO:
				expect = flytev1.PhaseFailed
			case kindContainerFlaky:
				spec.Retries = 1
			}
			if err := add(kind, 0, spec, expect); err != nil {
				return nil, err
			}
			plans[len(plans)-1].run = run
		}
	}
	for g := firstGroup; g < firstGroup+sz.cacheGroups; g++ {
		in := filepath.Join(dataDir, "inputs", fmt.Sprintf("group-%d.json", g))
		if err := os.WriteFile(in, fmt.Appendf(nil, `{"group":%d}`, g), 0o644); err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
		for range sz.perGroup {
			spec := flytev1.TaskActionSpec{TaskType: "core-sleep", Config: sleep(sz.cachedSleep),
				TaskName:      fmt.Sprintf("upgrade.cached-sleep.group%d", g),
				Cache:         &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true},
				InputURI:      fileURI(dataDir, "inputs", fmt.Sprintf("group-%d.json", g)),
				RunOutputBase: fileURI(dataDir, "outputs", fmt.Sprintf("group-%d", g))}
			if err := add(kindCachedSleep, g, spec, flytev1.PhaseSucceeded); err != nil {
				return nil, err
			}
		}
	}
	return plans, nil
}

func fileURI(dataDir string, elem ...string) string {
	return "file://" + filepath.ToSlash(filepath.Join(append([]string{dataDir}, elem...)...))
}

// failedAttempts is how many of a container action's attempts fail: a flaky action's
// first, a failing action's every one.
func failedAttempts(kind string) int {
	switch kind {
	case kindContainerKO:
		return 1000
	case kindContainerFlaky:
		return 1
	}
	return 0
}

// standIn is how the stand-in kubelet plays each container action: how its attempts end
// and how long its pods run, as the action's command would on a real node.
type standIn struct {
	mu    sync.Mutex
	plans map[string]*plan // by action
}

func newStandIn() *standIn {
	return &standIn{plans: map[string]*plan{}}
}

// add makes plans known, before their actions are created; the kubelet may be running.
func (st *standIn) add(plans []*plan) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, p := range plans {
		st.plans[p.name] = p
	}
}

func (st *standIn) plan(action string) *plan {
	st.mu.Lock()
	defer st.mu.Unlock()
	if p := st.plans[action]; p != nil {
		return p
	}
	return &plan{}
}

func (st *standIn) exitCode(action string, attempt int) int32 {
	if attempt <= failedAttempts(st.plan(action).kind) {
		return 1
	}
	return 0
}

func (st *standIn) runFor(action string) (time.Duration, time.Duration) {
	if p := st.plan(action); p.kind == kindContainerLong {
		return p.run, p.run
	}
	return 300 * time.Millisecond, time.Second
}
