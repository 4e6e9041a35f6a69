package executor_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/flytekube/backend/executor"

	"github.com/flytekube/backend/bench/benchutil"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/kubetest"
)

// bigAction is a container action whose pod carries all the spec allows of the long
// kinds: arguments, environment, annotations, and a Secret volume.
func bigAction(ns, name string) *flytev1.TaskAction {
	ta := containerAction(ns, name, 0)
	long := strings.Repeat("x", flytev1.MaxArgLength)
	ta.Spec.Container.Args = []string{long, long}
	ta.Spec.Container.Env = []corev1.EnvVar{{Name: "LONG", Value: long}}
	ta.Spec.EnvVars = map[string]string{"ALSO_LONG": long}
	ta.Spec.Secrets = []flytev1.TaskSecret{{Name: "db", MountPath: "/etc/db"}}
	ta.Spec.PodTemplate = &flytev1.PodTemplate{Metadata: flytev1.PodTemplateMetadata{Annotations: map[string]string{"note": long}}}
	return ta
}

// checkStripped fails unless spec, a pod spec from the executor's cache, holds nothing
// but what the executor reads, and its containers' names.
func checkStripped(t *testing.T, what string, spec corev1.PodSpec) {
	t.Helper()
	if len(spec.Volumes) != 0 {
		t.Errorf("%s: the cache holds volumes: %+v", what, spec.Volumes)
	}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if len(c.Command)+len(c.Args)+len(c.Env)+len(c.EnvFrom)+len(c.VolumeMounts) != 0 || c.Resources.Size() != 0 {
			t.Errorf("%s: the cache holds container %s's command, args, env, mounts or resources", what, c.Name)
		}
	}
}

// TestCachedPodsHoldWhatTheExecutorReads: the executor's informer keeps of a pod its
// metadata, its node and its status, which are all it reads, and not the spec that
// repeats the action's (arguments, environment, volumes): otherwise each action is held
// twice. Its writes to a pod are patches of what they change, so a stripped copy never
// wipes the rest: the pod the API server holds keeps its arguments after the finalizer
// goes.
func TestCachedPodsHoldWhatTheExecutorReads(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	cfg := testConfig()
	cfg.K8s.InjectFinalizer = true
	_, mgr := start(t, cfg, ns, runOptions{})

	ta := bigAction(ns, "big")
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "big-1")
	if err := env.Client.SubResource("binding").Create(ctx, pod, &corev1.Binding{Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}); err != nil {
		t.Fatal(err)
	}
	pod = waitPod(t, ns, "big-1")
	kubelet(t, pod, corev1.PodRunning, nil)
	waitPhase(t, client.ObjectKeyFromObject(ta), flytev1.PhaseRunning)

	var cached corev1.Pod
	eventually.True(t, 30*time.Second, func() bool {
		return mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(pod), &cached) == nil && cached.Status.Phase == corev1.PodRunning
	}, func() string { return "the running pod never reached the cache" })
	checkStripped(t, "pod", cached.Spec)
	if len(cached.Annotations) != 0 {
		t.Errorf("the cache holds the pod's annotations: %d of them", len(cached.Annotations))
	}
	if cached.Spec.NodeName != "node-1" || cached.Labels[k8s.LabelTaskActionUID] != string(ta.UID) ||
		metav1.GetControllerOf(&cached) == nil || len(cached.Finalizers) == 0 || len(cached.Status.ContainerStatuses) != 1 {
		t.Fatalf("the cache lost what the executor reads: node %q, labels %v, owners %v, finalizers %v, container statuses %v",
			cached.Spec.NodeName, cached.Labels, cached.OwnerReferences, cached.Finalizers, cached.Status.ContainerStatuses)
	}

	kubelet(t, pod, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: metav1.Now()})
	waitSucceeded(t, client.ObjectKeyFromObject(ta))
	var stored corev1.Pod
	eventually.True(t, 30*time.Second, func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &stored) == nil && len(stored.Finalizers) == 0
	}, func() string { return fmt.Sprintf("the pod's finalizer was never removed: %v", stored.Finalizers) })
	c := stored.Spec.Containers[0]
	if c.Name != flytek8s.ContainerName || len(c.Args) != 2 || len(c.Args[0]) != flytev1.MaxArgLength || len(stored.Spec.Volumes) == 0 || len(stored.Annotations) == 0 {
		t.Fatalf("removing the finalizer changed the pod's spec: args %d, volumes %d, annotations %d", len(c.Args), len(stored.Spec.Volumes), len(stored.Annotations))
	}
}

// TestCachedJobsHoldWhatTheExecutorReads: the same for a Job, whose pod template
// repeats the action's spec: the cache keeps its selector and status, which the k8s-job
// plugin reads, and not the template's containers.
func TestCachedJobsHoldWhatTheExecutorReads(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	_, mgr := start(t, testConfig(), ns, runOptions{})

	ta := bigAction(ns, "big")
	ta.Spec.TaskType = "k8s-job"
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	job := waitJob(t, ns, "big-1")
	var cached batchv1.Job
	eventually.True(t, 30*time.Second, func() bool {
		return mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(job), &cached) == nil
	}, func() string { return "the job never reached the cache" })
	checkStripped(t, "job", cached.Spec.Template.Spec)
	if len(cached.Spec.Template.Annotations)+len(cached.Annotations) != 0 {
		t.Errorf("the cache holds the job's annotations")
	}
	if cached.Spec.Selector == nil || cached.Labels[k8s.LabelTaskActionUID] != string(ta.UID) || metav1.GetControllerOf(&cached) == nil {
		t.Fatalf("the cache lost what the executor reads: selector %v, labels %v, owners %v", cached.Spec.Selector, cached.Labels, cached.OwnerReferences)
	}
}

// BenchmarkHeapPerLargeAction measures what the executor holds for each action of the
// longest command line the CRD admits (flytev1.MaxCommandLineLength): n such actions,
// their pods created and pending, the executor's live heap over its heap before them,
// per action; with pods and Jobs cached whole (the baseline, as before) and as the
// executor caches them, keeping what it reads, so that the action's spec is held once,
// in the informer of actions.
//
//	go test -run '^$' -bench HeapPerLargeAction -benchtime 1x -count 2 ./executor/
func BenchmarkHeapPerLargeAction(b *testing.B) {
	for _, c := range []struct {
		name  string
		whole bool
	}{{"whole-pods", true}, {"what-the-executor-reads", false}} {
		b.Run(c.name, func(b *testing.B) { heapPerLargeAction(b, c.whole) })
	}
}

// cacheWholeObjects makes the manager's cache as Setup asks for it, but keeping pods and
// Jobs whole (less their managed fields): the baseline, as before the executor kept only
// what it reads of them.
func cacheWholeObjects(c *rest.Config, opts cache.Options) (cache.Cache, error) {
	opts.DefaultTransform = cache.TransformStripManagedFields()
	return cache.New(c, opts)
}

func heapPerLargeAction(b *testing.B, whole bool) {
	const n = 100
	ctx := context.Background()
	for range b.N {
		ns := kubetest.Namespace(b, env.Client)
		cfg := testConfig()
		cfg.Namespaces = []string{ns}
		opts := inProcess()
		if whole {
			opts.NewCache = cacheWholeObjects
		}
		mgr, stop := kubetest.RunManager(b, func(ctx context.Context) (manager.Manager, error) {
			return executor.Setup(ctx, cfg, env.Config, slog.New(slog.DiscardHandler), opts)
		})
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			b.Fatal("the cache did not sync")
		}
		before := benchutil.LiveHeap()
		for i := range n {
			ta := containerAction(ns, fmt.Sprintf("big-%d", i), 0)
			ta.Spec.Container.Command = nil
			ta.Spec.Container.Args = make([]string, flytev1.MaxCommandLineLength/flytev1.MaxArgLength)
			for j := range ta.Spec.Container.Args {
				ta.Spec.Container.Args[j] = strings.Repeat(string(rune('a'+i%26)), flytev1.MaxArgLength)
			}
			if err := env.Client.Create(ctx, ta); err != nil {
				b.Fatal(err)
			}
		}
		eventually.True(b, 2*time.Minute, func() bool {
			var pods corev1.PodList
			var actions flytev1.TaskActionList
			return mgr.GetCache().List(ctx, &pods, client.InNamespace(ns)) == nil && len(pods.Items) == n &&
				mgr.GetCache().List(ctx, &actions, client.InNamespace(ns)) == nil && len(actions.Items) == n
		}, func() string { return "the pods never all reached the cache" })
		held := benchutil.LiveHeap() - before
		stop()
		b.ReportMetric(float64(held)/n/1024, "KiB/action")
		b.ReportMetric(float64(held)/(1<<20), "MiB")
	}
}

// TestCachedActionsHoldNoLastAppliedCopy: `kubectl apply` keeps a copy of the whole
// object in an annotation, which would hold an applied action's spec twice in the
// informer of actions. The executor's cache drops that annotation (and keeps the others);
// its writes to an action (status, finalizer patches) leave it on the API server.
func TestCachedActionsHoldNoLastAppliedCopy(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	_, mgr := start(t, testConfig(), ns, runOptions{})

	ta := &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: "applied", Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: "applied",
			TaskName: "demo.sleep", TaskType: "core-sleep", RunOutputBase: "mem://out/applied", Config: map[string]string{"duration": "0s"}},
	}
	ta.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: fmt.Sprintf("%+v", ta.Spec), "team": "data"}
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(t, client.ObjectKeyFromObject(ta))
	var cached flytev1.TaskAction
	eventually.True(t, 30*time.Second, func() bool {
		return mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(ta), &cached) == nil && cached.Status.Phase == flytev1.PhaseSucceeded
	}, func() string { return "the finished action never reached the cache" })
	if _, ok := cached.Annotations[corev1.LastAppliedConfigAnnotation]; ok || cached.Annotations["team"] != "data" {
		t.Fatalf("cached annotations %v; want team=data and no last-applied copy", cached.Annotations)
	}
	var stored flytev1.TaskAction
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ta), &stored); err != nil {
		t.Fatal(err)
	}
	if stored.Annotations[corev1.LastAppliedConfigAnnotation] != ta.Annotations[corev1.LastAppliedConfigAnnotation] || stored.Annotations["team"] != "data" {
		t.Fatalf("the executor's writes changed the action's annotations: %v", stored.Annotations)
	}
}

// TestCachedActionsHoldABoundedInlinePodTemplate: the inline pod template is the one
// part of a spec the API server cannot bound (its schema is free-form; CEL can neither
// see nor measure it), so an action could carry one of about a megabyte. The cache keeps
// no more of it than the executor would read, and the action fails as it would with the
// whole of it.
func TestCachedActionsHoldABoundedInlinePodTemplate(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	_, mgr := start(t, testConfig(), ns, runOptions{})

	huge := fmt.Sprintf(`{"containers":[{"name":"default","env":[{"name":"PAD","value":%q}]}]}`, strings.Repeat("x", 1<<20))
	ta := &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: "huge-template", Namespace: ns},
		Spec: flytev1.TaskActionSpec{Project: "demo", Domain: "development", RunName: "r1", ActionName: "huge-template",
			TaskName: "demo.container", TaskType: "container", RunOutputBase: "mem://out/huge-template",
			Container:   &flytev1.ContainerSpec{Image: "busybox"},
			PodTemplate: &flytev1.PodTemplate{Spec: k8sruntime.RawExtension{Raw: []byte(huge)}}},
	}
	if err := env.Client.Create(ctx, ta); err != nil {
		t.Fatal(err)
	}
	failed := waitFailed(t, client.ObjectKeyFromObject(ta))
	if e := failed.Status.Error; e == nil || e.Code != podtemplate.CodeInvalid || !strings.Contains(e.Message, "spec.podTemplate.spec is more than 65536 bytes") {
		t.Fatalf("error %+v; want %s naming the bound", e, podtemplate.CodeInvalid)
	}
	var cached flytev1.TaskAction
	if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(ta), &cached); err != nil {
		t.Fatal(err)
	}
	if n := len(cached.Spec.PodTemplate.Spec.Raw); n > podtemplate.MaxInlineBytes+1 {
		t.Fatalf("the cache holds %d bytes of the inline pod template; want at most %d", n, podtemplate.MaxInlineBytes+1)
	}
}
