package executor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/runtime/conditions/check"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
)

// phaseReleased holds the release keys (an action's config.release) the test has let go.
var phaseReleased sync.Map

// phasePlugin reports the phase its action's config.phase names, for as long as the
// test wants: until config.release is released, then config.then. "Retry" is a user
// failure that may be retried, "Failed" one that may not.
type phasePlugin struct{}

func (phasePlugin) GetID() string                                             { return "test-phase" }
func (phasePlugin) GetProperties() core.Properties                            { return core.Properties{} }
func (phasePlugin) Abort(context.Context, core.TaskExecutionContext) error    { return nil }
func (phasePlugin) Finalize(context.Context, core.TaskExecutionContext) error { return nil }

func (phasePlugin) Handle(_ context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	cfg := tCtx.Metadata().Action().Spec.Config
	phase := cfg["phase"]
	if _, ok := phaseReleased.Load(cfg["release"]); ok {
		phase = cfg["then"]
	}
	var info core.PhaseInfo
	switch phase {
	case "Queued":
		info = core.PhaseInfoQueued("Held")
	case "WaitingForResources":
		info = core.PhaseInfoWaitingForResources(0, "Quota", "waiting for quota")
	case "Initializing":
		info = core.PhaseInfoInitializing(0, "Pulling", "pulling the image")
	case "Running":
		info = core.PhaseInfoRunning(0, "Working")
	case "Succeeded":
		return core.DoTransition(core.PhaseInfoSuccess("")), nil
	case "Retry":
		return core.DoTransition(core.PhaseInfoUserFailure("Flaky", "failed, may be retried")), nil
	case "Failed":
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "Broken", "failed for good")), nil
	default:
		return core.Transition{}, fmt.Errorf("test-phase: no phase %q", phase)
	}
	// Looked at again soon only to see a release; the phase itself stays.
	info.RequeueAfter = 200 * time.Millisecond
	return core.DoTransition(info), nil
}

func phaseEntry() core.Entry {
	return core.Entry{ID: "test-phase", RegisteredTaskTypes: []string{"test-phase"},
		LoadPlugin: func(context.Context, core.SetupContext) (core.Plugin, error) { return phasePlugin{}, nil }}
}

func phaseAction(ns, name string, config map[string]string) *flytev1.TaskAction {
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: name,
			TaskName: "demo.phase", TaskType: "test-phase", RunOutputBase: "mem://out/r1", Config: config},
	}
}

// kstatusOf is what kstatus (Flux, kpt, cli-utils) makes of ta.
func kstatusOf(t *testing.T, ta *flytev1.TaskAction) *status.Result {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ta)
	if err != nil {
		t.Fatal(err)
	}
	res, err := status.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		t.Fatalf("kstatus: %v", err)
	}
	return res
}

// fluxView is a TaskAction as Flux's condition checker reads one.
type fluxView struct{ *unstructured.Unstructured }

func (f fluxView) GetConditions() []metav1.Condition {
	var ta flytev1.TaskAction
	_ = runtime.DefaultUnstructuredConverter.FromUnstructured(f.Object, &ta)
	return ta.Status.Conditions
}

// fluxCheck runs Flux's condition rules (fluxcd/pkg runtime/conditions/check), its
// failures and its warnings, on ta. Reconciling, Stalled and Failed are the conditions
// that are True when something is not (yet) well, in that order of weight.
func fluxCheck(t *testing.T, ta *flytev1.TaskAction) {
	t.Helper()
	if meta.FindStatusCondition(ta.Status.Conditions, flytev1.ConditionReady) == nil {
		// The checker's first rule; its others assume it holds (and panic without it).
		t.Errorf("Flux's condition rules: Ready condition must always be present; conditions %+v", ta.Status.Conditions)
		return
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ta)
	if err != nil {
		t.Fatal(err)
	}
	checker := check.NewChecker(nil, &check.Conditions{
		NegativePolarity: []string{flytev1.ConditionStalled, flytev1.ConditionReconciling, flytev1.ConditionFailed}})
	checker.DisableFetch = true
	if fail, warn := checker.Check(context.Background(), fluxView{&unstructured.Unstructured{Object: obj}}); fail != nil || warn != nil {
		t.Errorf("Flux's condition rules: failures %v; warnings %v; conditions %+v", fail, warn, ta.Status.Conditions)
	}
}

// TestToolsReadTheConditions: kstatus reads an action the executor reconciles as
// InProgress while it runs (in every phase before the end, and in a retry's backoff),
// Current once it succeeded and Failed once it failed or timed out; an aborted action,
// being deleted, is Terminating, and its conditions alone read Failed. Every status
// passes Flux's condition rules.
func TestToolsReadTheConditions(t *testing.T) {
	ns := env.Namespace(t)
	cfg := testConfig()
	// A retried attempt waits out its backoff for as long as the test looks.
	cfg.RetryBackoff.Base, cfg.RetryBackoff.Cap = metav1.Duration{Duration: time.Hour}, metav1.Duration{Duration: time.Hour}
	start(t, cfg, ns, runOptions{plugins: []core.Entry{phaseEntry()}})

	const hold = "test.flyte.org/hold" // keeps an aborted action to be looked at
	lastReason := func(ta *flytev1.TaskAction) string {
		last, _ := ta.Status.PhaseHistory.Last()
		return last.Reason
	}
	for _, tc := range []struct {
		name    string
		config  map[string]string
		retries int32
		timeout time.Duration
		abort   bool
		reached func(*flytev1.TaskAction) bool
		want    status.Status
	}{
		{name: "queued", config: map[string]string{"phase": "Queued"},
			reached: func(ta *flytev1.TaskAction) bool {
				return ta.Status.Phase == flytev1.PhaseQueued && ta.Status.PluginPhase == "Queued"
			}, want: status.InProgressStatus},
		{name: "waiting", config: map[string]string{"phase": "WaitingForResources"},
			reached: func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseWaitingForResources }, want: status.InProgressStatus},
		{name: "initializing", config: map[string]string{"phase": "Initializing"},
			reached: func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseInitializing }, want: status.InProgressStatus},
		{name: "running", config: map[string]string{"phase": "Running"},
			reached: func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseRunning }, want: status.InProgressStatus},
		{name: "backing-off", config: map[string]string{"phase": "Retry"}, retries: 1,
			reached: func(ta *flytev1.TaskAction) bool {
				return lastReason(ta) == flytev1.ReasonRetrying && ta.Status.NextAttemptAt != nil
			}, want: status.InProgressStatus},
		{name: "succeeded", config: map[string]string{"phase": "Succeeded"},
			reached: func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseSucceeded }, want: status.CurrentStatus},
		{name: "failed", config: map[string]string{"phase": "Failed"},
			reached: func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseFailed }, want: status.FailedStatus},
		{name: "timed-out", config: map[string]string{"phase": "Running"}, timeout: time.Second,
			reached: func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseTimedOut }, want: status.FailedStatus},
		{name: "aborted", config: map[string]string{"phase": "Running"}, abort: true,
			reached: func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseAborted }, want: status.TerminatingStatus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ta := phaseAction(ns, tc.name, tc.config)
			ta.Spec.Retries = tc.retries
			if tc.timeout > 0 {
				ta.Spec.Timeout = &metav1.Duration{Duration: tc.timeout}
			}
			if tc.abort {
				ta.Finalizers = []string{hold}
			}
			create(t, ta)
			key := client.ObjectKeyFromObject(ta)
			if tc.abort {
				waitPhase(t, key, flytev1.PhaseRunning)
				if err := env.Client.Delete(ctx, ta); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					var got flytev1.TaskAction
					if env.Client.Get(ctx, key, &got) == nil && controllerutil.RemoveFinalizer(&got, hold) {
						_ = env.Client.Update(ctx, &got)
					}
				})
			}
			var got flytev1.TaskAction
			eventually.True(t, time.Minute, func() bool {
				return env.Client.Get(ctx, key, &got) == nil && tc.reached(&got)
			}, func() string { return fmt.Sprintf("%s never got there; status %+v", tc.name, got.Status) })

			if res := kstatusOf(t, &got); res.Status != tc.want {
				t.Errorf("kstatus reads %s (%s); want %s; conditions %+v", res.Status, res.Message, tc.want, got.Status.Conditions)
			}
			if tc.abort {
				// kstatus reads a deleted object as Terminating before its conditions:
				// what they say alone is Failed.
				alive := got.DeepCopy()
				alive.DeletionTimestamp = nil
				if res := kstatusOf(t, alive); res.Status != status.FailedStatus {
					t.Errorf("kstatus reads an aborted action's conditions as %s (%s); want Failed; conditions %+v", res.Status, res.Message, got.Status.Conditions)
				}
			}
			fluxCheck(t, &got)
		})
	}
}

// kubectlBinary is the kubectl hack/envtest.sh builds beside kube-apiserver.
func kubectlBinary(t *testing.T) string {
	t.Helper()
	assets, err := kubetest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(assets, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl: %v (hack/envtest.sh builds it)", err)
	}
	return bin
}

// kubectl runs kubectl against the test's API server and returns what it printed and
// its exit status.
func kubectl(bin, kubeconfig string, args ...string) (string, error) {
	out, err := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestKubectlWaitsForTheEnd: `kubectl wait --for=condition=Finished` returns once an
// action ends, whichever way; --for=condition=Succeeded once it succeeded, and, asked
// after the end with no time to wait, it says at once which way it went.
func TestKubectlWaitsForTheEnd(t *testing.T) {
	ns := env.Namespace(t)
	start(t, testConfig(), ns, runOptions{plugins: []core.Entry{phaseEntry()}})
	raw, err := env.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	bin, kubeconfig := kubectlBinary(t), filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, raw, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, then := range []string{"Succeeded", "Failed"} {
		t.Run(then, func(t *testing.T) {
			name := strings.ToLower(then)
			release := ns + "/" + name
			create(t, phaseAction(ns, name, map[string]string{"phase": "Running", "release": release, "then": then}))
			waitPhase(t, client.ObjectKey{Namespace: ns, Name: name}, flytev1.PhaseRunning)
			// Asked while it runs, with no time to wait, kubectl says it has not finished.
			if out, err := kubectl(bin, kubeconfig, "wait", "-n", ns, "taskaction/"+name, "--for=condition=Finished", "--timeout=0s"); err == nil {
				t.Fatalf("kubectl wait --for=condition=Finished returned at once on a running action: %s", out)
			}

			type result struct {
				err error
				out string
			}
			waits := map[string]chan result{}
			for _, cond := range []string{"Finished", then} {
				ch := make(chan result, 1)
				waits[cond] = ch
				go func() {
					out, err := kubectl(bin, kubeconfig, "wait", "-n", ns, "taskaction/"+name, "--for=condition="+cond, "--timeout=2m")
					ch <- result{err, out}
				}()
			}
			phaseReleased.Store(release, true)
			for cond, ch := range waits {
				if r := <-ch; r.err != nil {
					t.Errorf("kubectl wait --for=condition=%s on an action that %s: %v: %s", cond, name, r.err, r.out)
				} else if !strings.Contains(r.out, "condition met") {
					t.Errorf("kubectl wait --for=condition=%s printed %q", cond, r.out)
				}
			}
			// Once finished, Succeeded says at once which way it went.
			out, err := kubectl(bin, kubeconfig, "wait", "-n", ns, "taskaction/"+name, "--for=condition=Succeeded", "--timeout=0s")
			if (err == nil) != (then == "Succeeded") {
				t.Errorf("kubectl wait --for=condition=Succeeded --timeout=0s on an action that %s: %v: %s", name, err, out)
			}
			out, err = kubectl(bin, kubeconfig, "wait", "-n", ns, "taskaction/"+name, "--for=condition=Succeeded=False", "--timeout=0s")
			if (err == nil) != (then == "Failed") {
				t.Errorf("kubectl wait --for=condition=Succeeded=False --timeout=0s on an action that %s: %v: %s", name, err, out)
			}
		})
	}
}

// TestConditionsAnOlderExecutorLeftAreRestated: an executor of v0.2.0 moves only
// Progressing, Succeeded (to True) and Failed. Actions it finished before the upgrade
// lack the other conditions, and one it finished after a rollback keeps what this
// executor wrote while it ran (Reconciling True: kstatus would read it InProgress for
// ever). This executor restates them from the phase and Progressing on its first pass.
func TestConditionsAnOlderExecutorLeftAreRestated(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	at := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	cond := func(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: "from v0.2.0", ObservedGeneration: 1, LastTransitionTime: at}
	}
	entry := func(p flytev1.Phase, reason string) flytev1.PhaseTransition {
		return flytev1.PhaseTransition{Phase: p, Attempt: 1, Reason: reason, OccurredAt: metav1.NewMicroTime(at.Time)}
	}
	for _, tc := range []struct {
		name  string
		phase flytev1.Phase
		conds []metav1.Condition
	}{
		{"failed-before-the-upgrade", flytev1.PhaseFailed, []metav1.Condition{
			cond(flytev1.ConditionProgressing, metav1.ConditionFalse, "Broken"), cond(flytev1.ConditionFailed, metav1.ConditionTrue, "Broken"),
		}},
		{"succeeded-before-the-upgrade", flytev1.PhaseSucceeded, []metav1.Condition{
			cond(flytev1.ConditionProgressing, metav1.ConditionFalse, "Succeeded"), cond(flytev1.ConditionSucceeded, metav1.ConditionTrue, "Succeeded"),
		}},
		// Ran under this executor, finished by v0.2.0 after a rollback.
		{"failed-after-a-rollback", flytev1.PhaseFailed, []metav1.Condition{
			cond(flytev1.ConditionProgressing, metav1.ConditionFalse, "Broken"), cond(flytev1.ConditionFailed, metav1.ConditionTrue, "Broken"),
			cond(flytev1.ConditionSucceeded, metav1.ConditionUnknown, "Working"), cond(flytev1.ConditionFinished, metav1.ConditionFalse, "Working"),
			cond(flytev1.ConditionReady, metav1.ConditionFalse, "Working"), cond(flytev1.ConditionReconciling, metav1.ConditionTrue, "Working"),
		}},
		{"succeeded-after-a-rollback", flytev1.PhaseSucceeded, []metav1.Condition{
			cond(flytev1.ConditionProgressing, metav1.ConditionFalse, "Succeeded"), cond(flytev1.ConditionSucceeded, metav1.ConditionTrue, "Succeeded"),
			cond(flytev1.ConditionFinished, metav1.ConditionFalse, "Working"),
			cond(flytev1.ConditionReady, metav1.ConditionFalse, "Working"), cond(flytev1.ConditionReconciling, metav1.ConditionTrue, "Working"),
		}},
	} {
		ta := phaseAction(ns, tc.name, map[string]string{"phase": "Running"})
		create(t, ta)
		ta.Status = flytev1.TaskActionStatus{Phase: tc.phase, Conditions: tc.conds, ObservedGeneration: 1, Attempts: 1,
			PhaseHistory: []flytev1.PhaseTransition{entry(flytev1.PhaseQueued, "Queued"), entry(tc.phase, tc.conds[0].Reason)},
			StartedAt:    &at, CompletedAt: &at}
		if err := env.Client.Status().Update(ctx, ta); err != nil {
			t.Fatal(err)
		}
	}
	start(t, testConfig(), ns, runOptions{plugins: []core.Entry{phaseEntry()}})

	for _, tc := range []struct {
		name string
		want status.Status
	}{{"failed-before-the-upgrade", status.FailedStatus}, {"succeeded-before-the-upgrade", status.CurrentStatus},
		{"failed-after-a-rollback", status.FailedStatus}, {"succeeded-after-a-rollback", status.CurrentStatus}} {
		key := client.ObjectKey{Namespace: ns, Name: tc.name}
		var got flytev1.TaskAction
		eventually.True(t, time.Minute, func() bool {
			// No case starts with Finished True.
			return env.Client.Get(ctx, key, &got) == nil && meta.IsStatusConditionTrue(got.Status.Conditions, flytev1.ConditionFinished)
		}, func() string {
			return fmt.Sprintf("%s: conditions never restated: %+v", tc.name, got.Status.Conditions)
		})
		if res := kstatusOf(t, &got); res.Status != tc.want {
			t.Errorf("%s: kstatus reads %s (%s); want %s; conditions %+v", tc.name, res.Status, res.Message, tc.want, got.Status.Conditions)
		}
		fluxCheck(t, &got)
		// What is restated says what Progressing says, as of when it said it.
		for _, c := range got.Status.Conditions {
			if c.Message != "from v0.2.0" || !c.LastTransitionTime.Equal(&at) || c.ObservedGeneration != 1 {
				t.Errorf("%s: condition %+v; want Progressing's message, time and generation", tc.name, c)
			}
		}
		if got.Status.Phase == flytev1.PhaseSucceeded && meta.FindStatusCondition(got.Status.Conditions, flytev1.ConditionFailed) != nil {
			t.Errorf("%s: a Failed condition on a succeeded action: %+v", tc.name, got.Status.Conditions)
		}
	}
}
