package executorbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/test/kubetest"
)

// succeed writes the status a kubelet writes when a pod's only container exited 0.
func succeed(ctx context.Context, c client.Client, pod *corev1.Pod) error {
	now := metav1.Now()
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "task", Image: "busybox:1.36", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}}}}
	return c.Status().Update(ctx, pod)
}

// startKubelet finishes every pod that appears in ns at once, as a node would if each
// task took no time: one status write per pod.
func startKubelet(ctx context.Context, env *kubetest.Env, ns string) error {
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	open := func() (watch.Interface, error) { return wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns)) }
	w, err := open()
	if err != nil {
		return fmt.Errorf("kubelet: watching pods: %w", err)
	}
	pods := make(chan *corev1.Pod, 1024)
	go func() {
		defer close(pods)
		defer func() { w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					if w, err = open(); err != nil {
						return
					}
					continue
				}
				p, isPod := ev.Object.(*corev1.Pod)
				if isPod && ev.Type == watch.Added && (p.Status.Phase == "" || p.Status.Phase == corev1.PodPending) {
					pods <- p
				}
			}
		}
	}()
	for range 8 {
		go func() {
			for p := range pods {
				_ = succeed(ctx, wc, p) // a conflict means someone finished it already
			}
		}()
	}
	return nil
}

// runPodCeiling is the ceiling of a container action: the same writes the user, the
// executor and the kubelet make, by a plain client — the action's create, its pod's
// create, the pod's status, the action's final status. With executorWrites, the plain
// client makes the executor's writes exactly: the finalizer put on and taken off (each
// a patch of the main resource) and the Queued status besides; with the finalizer put on
// at admission (o.FinalizerAtAdmission), the API server puts it on here too, and the
// client only takes it off.
func runPodCeiling(ctx context.Context, env *kubetest.Env, o Options, taskType string, prepare func(*flytev1.TaskAction, int) error, executorWrites bool) (float64, error) {
	ns := fmt.Sprintf("pod-ceiling-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, env.Client, ns); err != nil {
		return 0, err
	}
	if executorWrites && o.FinalizerAtAdmission {
		remove, err := kubetest.FinalizerAtAdmission(ctx, env.Client, ns, controller.Finalizer)
		defer remove()
		if err != nil {
			return 0, err
		}
	}
	finalizer := func(ta *flytev1.TaskAction, change func(client.Object, string) bool) error {
		patch := client.MergeFromWithOptions(ta.DeepCopy(), client.MergeFromWithOptimisticLock{})
		change(ta, controller.Finalizer)
		return env.Client.Patch(ctx, ta, patch)
	}
	start := time.Now()
	_, err := create(ctx, env.Client, o, ns, taskType, prepare, func(ta *flytev1.TaskAction) error {
		now := metav1.Now()
		if executorWrites {
			if !o.FinalizerAtAdmission {
				if err := finalizer(ta, controllerutil.AddFinalizer); err != nil {
					return err
				}
			}
			ta.Status = flytev1.TaskActionStatus{Phase: flytev1.PhaseQueued, Attempts: 1,
				PhaseHistory: []flytev1.PhaseTransition{{Phase: flytev1.PhaseQueued, Attempt: 1, OccurredAt: metav1.NewMicroTime(now.Time)}}}
			if err := env.Client.Status().Update(ctx, ta); err != nil {
				return err
			}
		}
		pod := benchPod(ns, ta.Name+"-1", map[string]string{core.LabelManagedBy: core.ManagedByValue})
		if err := env.Client.Create(ctx, pod); err != nil {
			return err
		}
		if err := succeed(ctx, env.Client, pod); err != nil {
			return err
		}
		ta.Status.Phase, ta.Status.Attempts, ta.Status.CompletedAt = flytev1.PhaseSucceeded, 1, &now
		ta.Status.PhaseHistory = append(ta.Status.PhaseHistory, flytev1.PhaseTransition{Phase: flytev1.PhaseSucceeded, Attempt: 1, Version: int32(len(ta.Status.PhaseHistory)), OccurredAt: metav1.NewMicroTime(now.Time)})
		if err := env.Client.Status().Update(ctx, ta); err != nil || !executorWrites {
			return err
		}
		return finalizer(ta, controllerutil.RemoveFinalizer)
	})
	if err != nil {
		return 0, fmt.Errorf("pod ceiling: %w", err)
	}
	return float64(o.Actions) / time.Since(start).Seconds(), nil
}

// benchPod is a pod of the size the container plugin makes.
func benchPod(ns, name string, labels map[string]string) *corev1.Pod {
	env := []corev1.EnvVar{{Name: "FLYTE_INPUT_URI", Value: "s3://bucket/" + ns + "/" + name + "/inputs.pb"},
		{Name: "FLYTE_OUTPUT_PREFIX", Value: "s3://bucket/" + ns + "/" + name}, {Name: "FLYTE_ATTEMPT", Value: "1"},
		{Name: "FLYTE_PROJECT", Value: "bench"}, {Name: "FLYTE_DOMAIN", Value: "development"}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "task", Image: "busybox:1.36", Command: []string{"sh", "-c", "true"}, Env: env,
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
		}}},
	}
}

// memoryResult is what the executor's informers hold in a cluster full of pods.
type memoryResult struct {
	executorHeap, unfilteredHeap uint64
	executorPods, unfilteredPods int
}

func (m memoryResult) write(w io.Writer, o Options) {
	fmt.Fprintf(w, "### Memory: %d pods of others and %d of the executor in its namespace\n\n", o.UnmanagedPods, o.ManagedPods)
	fmt.Fprintln(w, "| what | pods cached | heap after sync (MiB) | / unfiltered |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
	fmt.Fprintf(w, "| baseline: one unfiltered pod informer | %d | %.1f | 100%% |\n", m.unfilteredPods, mib(m.unfilteredHeap))
	fmt.Fprintf(w, "| the executor (whole manager, informers filtered by label) | %d | %.1f | %.0f%% |\n\n", m.executorPods, mib(m.executorHeap),
		100*float64(m.executorHeap)/float64(m.unfilteredHeap))
}

// measureMemory fills a namespace with others' pods and the executor's, then measures
// the heap the executor takes once its caches are in sync, beside what one pod informer
// without a label selector takes in the same process.
func measureMemory(ctx context.Context, env *kubetest.Env, o Options) (memoryResult, error) {
	ns := fmt.Sprintf("memory-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, env.Client, ns); err != nil {
		return memoryResult{}, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	total := o.UnmanagedPods + o.ManagedPods
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				labels := map[string]string{"app": "web", "team": "others"}
				if i < o.ManagedPods {
					labels = map[string]string{core.LabelManagedBy: core.ManagedByValue, core.LabelAttempt: "1"}
				}
				if err := env.Client.Create(ctx, benchPod(ns, fmt.Sprintf("p%05d", i), labels)); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return memoryResult{}, fmt.Errorf("memory: creating pods: %w", err)
	}

	var m memoryResult
	// The executor, as its binary sets itself up.
	before := benchutil.LiveHeap()
	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL, cfg.CacheServiceURL = "", ""
	cfg.GC.Interval = metav1.Duration{}
	mctx, stop := context.WithCancel(ctx)
	cfg.Namespaces = []string{ns}
	mgr, err := executor.Setup(mctx, cfg, env.Config, slog.New(slog.DiscardHandler),
		executor.Options{SkipNameValidation: true, MetricsRegistry: prometheus.NewRegistry()})
	if err != nil {
		stop()
		return m, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	var cached corev1.PodList
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		err = fmt.Errorf("the cache did not sync")
	} else {
		err = mgr.GetCache().List(ctx, &cached, client.InNamespace(ns))
	}
	m.executorPods = len(cached.Items)
	cached = corev1.PodList{} // the copies the list returned are not the executor's
	m.executorHeap = benchutil.LiveHeap() - before
	stop()
	if derr := <-done; err == nil {
		err = derr
	}
	if err != nil {
		return m, fmt.Errorf("memory: executor: %w", err)
	}

	// The baseline: a pod informer without a selector in the same namespace.
	before = benchutil.LiveHeap()
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		return m, err
	}
	cctx, stopCache := context.WithCancel(ctx)
	defer stopCache()
	go func() { _ = c.Start(cctx) }()
	if !c.WaitForCacheSync(cctx) {
		return m, fmt.Errorf("memory: the unfiltered informer did not sync")
	}
	var all corev1.PodList
	if err := c.List(ctx, &all, client.InNamespace(ns)); err != nil {
		return m, fmt.Errorf("memory: unfiltered informer: %w", err)
	}
	m.unfilteredPods = len(all.Items)
	all = corev1.PodList{}
	m.unfilteredHeap = benchutil.LiveHeap() - before
	runtime.KeepAlive(c)
	return m, nil
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
