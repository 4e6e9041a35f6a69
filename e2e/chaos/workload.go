package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// Kinds of action in the workload.
const (
	kindSleep       = "sleep"        // core-sleep, a short sleep
	kindSleepRetry  = "sleep-retry"  // core-sleep whose first attempt fails, with one retry
	kindEcho        = "echo"         // core-echo
	kindCachedEcho  = "cached-echo"  // core-echo, cacheable and serializable, keys shared
	kindCachedSleep = "cached-sleep" // core-sleep, cacheable and serializable, keys shared: reservations held for a while
	kindContainerOK = "container-ok" // a pod that exits 0
	kindContainerKO = "container-ko" // a pod that exits 1, no retries: the action fails
	kindFlaky       = "container-flaky"
)

// How the client deletes an action, if it does.
const (
	keep            = ""
	deleteAtOnce    = "at-once"    // right after creating it
	deleteOnRunning = "on-running" // right after it reports Running
	deleteLater     = "later"      // at a random time within its life
)

// plan is one action of the workload, as the seed made it.
type plan struct {
	name, kind, deletion string
	at                   time.Duration // after the start of the chaos
	deleteAfter          time.Duration // for deleteLater
	expect               flytev1.Phase // without a deletion
	action               *flytev1.TaskAction
	// hostile marks a plan of the hostile tenant (hostile.go): code is the error code it
	// must fail with, victim the chaos plan a forged one names.
	hostile      bool
	code, victim string
}

// workload is every action of a run, planned from the seed before anything starts.
type workload struct {
	plans  []*plan
	byName map[string]*plan

	mu      sync.Mutex
	created map[string]bool
	// createdAt is when each action's create was accepted.
	createdAt map[string]time.Time
	deleted   map[string]time.Time // when the client's delete was accepted
	errs      []string
}

// planWorkload draws the actions of a run of duration d from rnd; container actions
// run image.
func planWorkload(rnd *rand.Rand, d time.Duration, dataDir, image string) (*workload, error) {
	w := &workload{byName: map[string]*plan{}, created: map[string]bool{}, createdAt: map[string]time.Time{}, deleted: map[string]time.Time{}}
	kinds := []string{kindSleep, kindSleep, kindSleepRetry, kindEcho, kindCachedEcho, kindCachedEcho, kindCachedSleep,
		kindContainerOK, kindContainerOK, kindContainerKO, kindFlaky}
	const perSecond = 2
	n := max(int(d.Seconds()*perSecond), 24)
	const groups = 3 // cache keys shared by the cacheable actions
	for g := range groups {
		if err := os.WriteFile(filepath.Join(dataDir, "inputs", fmt.Sprintf("group-%d.json", g)), fmt.Appendf(nil, `{"group":%d}`, g), 0o644); err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
	}
	for i := range n {
		p := &plan{kind: kinds[rnd.IntN(len(kinds))], at: time.Duration(rnd.Int64N(int64(d)))}
		// The first actions cover every kind of deletion, so that a short run has them all.
		first := i < 16
		switch r := rnd.IntN(100); {
		case first && i%8 == 0 || r < 5:
			p.deletion = deleteAtOnce
		case first && i%8 == 1 || r < 10:
			p.deletion = deleteOnRunning
		case r < 14:
			p.deletion, p.deleteAfter = deleteLater, time.Duration(rnd.Int64N(int64(4*time.Second)))
		}
		p.name = fmt.Sprintf("a%04d-%s", i, p.kind)
		group := rnd.IntN(groups)
		ta, expect, err := actionOf(p.name, p.kind, group, rnd, dataDir)
		if c := ta.Spec.Container; c != nil {
			// On a real node the container itself does what exitCode says, for a while
			// (not drawn, so that a seed plans the same actions on either node), and
			// ends on SIGTERM as the stand-in's do (sh as PID 1 would ignore it).
			c.Image, c.Command = image, []string{"sh", "-c", fmt.Sprintf(`trap 'exit 143' TERM; sleep %d & wait; [ "$%s" -gt %d ]`,
				1+i%3, flytek8s.EnvAttempt, failedAttempts(p.kind))}
		}
		if err != nil {
			return nil, err
		}
		p.action, p.expect = ta, expect
		if p.kind != kindCachedEcho && p.kind != kindCachedSleep {
			in := filepath.Join(dataDir, "inputs", p.name+".json")
			if err := os.WriteFile(in, fmt.Appendf(nil, `{"n":%d}`, i), 0o644); err != nil {
				return nil, fmt.Errorf("workload: %w", err)
			}
			p.action.Spec.InputURI = "file://" + filepath.ToSlash(in)
		}
		w.plans = append(w.plans, p)
		w.byName[p.name] = p
	}
	return w, nil
}

// actionOf builds the TaskAction of a plan and the phase it must end in.
func actionOf(name, kind string, group int, rnd *rand.Rand, dataDir string) (*flytev1.TaskAction, flytev1.Phase, error) {
	spec := flytev1.TaskActionSpec{Project: "chaos", Domain: "development", RunName: "soak", ActionName: name,
		TaskName: "chaos." + kind, RunOutputBase: "file://" + filepath.ToSlash(filepath.Join(dataDir, "outputs", name))}
	expect := flytev1.PhaseSucceeded
	sleep := func(d time.Duration) map[string]string { return map[string]string{"duration": d.String()} }
	cached := func() {
		spec.TaskName = fmt.Sprintf("chaos.%s.group%d", kind, group)
		spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true}
		spec.InputURI = "file://" + filepath.ToSlash(filepath.Join(dataDir, "inputs", fmt.Sprintf("group-%d.json", group)))
		// The outputs of an identical action are the run's: one base for the group.
		spec.RunOutputBase = "file://" + filepath.ToSlash(filepath.Join(dataDir, "outputs", fmt.Sprintf("group-%d", group)))
	}
	switch kind {
	case kindSleep:
		spec.TaskType, spec.Config = "core-sleep", sleep(time.Duration(100+rnd.IntN(2900))*time.Millisecond)
	case kindSleepRetry:
		spec.TaskType, spec.Config, spec.Retries = "core-sleep", sleep(300*time.Millisecond), 1
		spec.Config["failAttempts"] = "1"
	case kindEcho:
		spec.TaskType = "core-echo"
	case kindCachedEcho:
		spec.TaskType = "core-echo"
		cached()
	case kindCachedSleep:
		spec.TaskType, spec.Config = "core-sleep", sleep(2*time.Second)
		cached()
	case kindContainerOK, kindContainerKO, kindFlaky:
		spec.TaskType = "container"
		spec.Container = &flytev1.ContainerSpec{}
		switch kind {
		case kindContainerKO:
			expect = flytev1.PhaseFailed
		case kindFlaky:
			spec.Retries = 1
		}
	default:
		return nil, "", fmt.Errorf("workload: unknown kind %q", kind)
	}
	return &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: taskNamespace}, Spec: spec}, expect, nil
}

// failedAttempts is how many of a container action's attempts fail: a flaky action's
// first, a failing action's every one.
func failedAttempts(kind string) int {
	switch kind {
	case kindContainerKO:
		return 1000
	case kindFlaky:
		return 1
	}
	return 0
}

// exitCode is how the stand-in kubelet ends an attempt of an action, as a real node
// running the action's command would.
func (w *workload) exitCode(action string, attempt int) int32 {
	if p := w.byName[action]; p != nil && attempt <= failedAttempts(p.kind) {
		return 1
	}
	return 0
}

// leave does what a hostile action's container would do before the stand-in kubelet
// ends its pod (hostile.go).
func (w *workload) leave(action string, pod *corev1.Pod) error {
	return leave(w.byName[action], pod)
}

// run creates every action at its time and deletes the ones planned for deletion.
func (w *workload) run(ctx context.Context, c client.Client, obs *observer) {
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range w.plans {
		wg.Go(func() {
			sleep(ctx, time.Until(start.Add(p.at)))
			if p.victim != "" {
				// A forger strikes once its victim has finished, so that what it would
				// write is not then replaced by the victim's own and goes unseen.
				deadline := time.Now().Add(2 * time.Minute)
				for time.Now().Before(deadline) && ctx.Err() == nil {
					if r, _ := obs.record(p.victim); r.last != nil && r.last.Status.Phase.IsTerminal() {
						break
					}
					sleep(ctx, 100*time.Millisecond)
				}
			}
			if ctx.Err() != nil {
				return
			}
			if !w.create(ctx, c, p) {
				return
			}
			switch p.deletion {
			case deleteAtOnce:
			case deleteOnRunning:
				// Right after the Running report, the window in which the executor has
				// told the events service and may not yet hold a finalizer.
				deadline := time.Now().Add(time.Minute)
				for time.Now().Before(deadline) && ctx.Err() == nil {
					r, _ := obs.record(p.name)
					if r.running || (r.last != nil && r.last.Status.Phase.IsTerminal()) {
						break
					}
					sleep(ctx, 5*time.Millisecond)
				}
			case deleteLater:
				sleep(ctx, p.deleteAfter)
			default:
				return
			}
			w.delete(ctx, c, p)
		})
	}
	wg.Wait()
}

// create creates a plan's action, retrying through an outage of the API server.
func (w *workload) create(ctx context.Context, c client.Client, p *plan) bool {
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.Create(cctx, p.action.DeepCopy())
		cancel()
		if err == nil || (apierrors.IsAlreadyExists(err) && try > 0) {
			w.mu.Lock()
			w.created[p.name] = true
			if _, ok := w.createdAt[p.name]; !ok {
				w.createdAt[p.name] = time.Now()
			}
			w.mu.Unlock()
			return true
		}
		if ctx.Err() != nil || try > 120 || apierrors.IsInvalid(err) {
			w.fail("creating %s: %v", p.name, err)
			return false
		}
		sleep(ctx, time.Second)
	}
}

// delete deletes a plan's action as a client would, retrying through an outage.
func (w *workload) delete(ctx context.Context, c client.Client, p *plan) {
	for try := 0; ; try++ {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.Delete(dctx, p.action.DeepCopy())
		cancel()
		if err == nil || apierrors.IsNotFound(err) {
			w.mu.Lock()
			w.deleted[p.name] = time.Now()
			w.mu.Unlock()
			return
		}
		if ctx.Err() != nil || try > 120 {
			w.fail("deleting %s: %v", p.name, err)
			return
		}
		sleep(ctx, time.Second)
	}
}

func (w *workload) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, fmt.Sprintf(format, args...))
}
