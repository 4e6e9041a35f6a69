package executorbench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/test/nodetest"
	"github.com/flytekube/backend/test/repo"
)

// realNodeResult is container actions on a real node beside the same pods made by a
// plain client.
type realNodeResult struct {
	actions        int
	pods, executor realRun
}

// realRun is how one kind of object fared, from the first create until the last was
// done.
type realRun struct {
	perSecond float64
	latency   []time.Duration // each one's, from its creation until it was seen done
}

// percentile is the latency below which a fraction p of the objects were done.
func (r realRun) percentile(p float64) time.Duration {
	return benchutil.Percentile(r.latency, p).Round(time.Millisecond)
}

// runRealNode starts a real node (hack/node.sh) and runs, one after the other, o.RealNodeActions
// pods created by a plain client (each a container that exits at once) and as many
// container actions run by the executor, created by o.Creators clients; each figure runs
// from the first create until the last pod or action has succeeded.
func runRealNode(ctx context.Context, o Options, progress io.Writer) (realNodeResult, error) {
	res := realNodeResult{actions: o.RealNodeActions}
	if why := nodetest.Unavailable(); why != "" {
		return res, fmt.Errorf("real node: %s", why)
	}
	crds, err := repo.Path("deploy", "crd")
	if err != nil {
		return res, err
	}
	scheme, err := executor.Scheme()
	if err != nil {
		return res, err
	}
	fmt.Fprintln(progress, "real node: starting it")
	node, err := nodetest.Start(nodetest.Options{CRDDirectoryPaths: []string{crds}, Scheme: scheme})
	if err != nil {
		return res, err
	}
	defer func() { _ = node.Stop() }()
	wc, err := client.NewWithWatch(node.Config, client.Options{Scheme: scheme})
	if err != nil {
		return res, err
	}
	image := node.Images[0]

	fmt.Fprintln(progress, "real node: pods by a plain client")
	ns := fmt.Sprintf("real-pods-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, node.Client, ns); err != nil {
		return res, err
	}
	res.pods, err = createAndWait(ctx, wc, ns, o, &corev1.PodList{}, func(i int) *corev1.Pod {
		pod := benchPod(ns, fmt.Sprintf("p%05d-1", i), nil)
		pod.Spec.Containers[0].Image = image
		return pod
	}, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if err != nil {
		return res, fmt.Errorf("real node, pods: %w", err)
	}

	fmt.Fprintln(progress, "real node: container actions by the executor")
	ns = fmt.Sprintf("real-actions-%d", time.Now().UnixNano()%1e6)
	if err := namespace(ctx, node.Client, ns); err != nil {
		return res, err
	}
	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL, cfg.CacheServiceURL = "", ""
	cfg.GC.Interval = metav1.Duration{}
	cfg.LeaderElect = false
	cfg.Namespaces = []string{ns}
	_, stop, err := startExecutor(ctx, cfg, node.Config, executor.Options{})
	if err != nil {
		return res, fmt.Errorf("real node: %w", err)
	}
	defer stop()
	res.executor, err = createAndWait(ctx, wc, ns, o, &flytev1.TaskActionList{}, func(i int) *flytev1.TaskAction {
		ta := action(ns, fmt.Sprintf("p%05d", i), "container")
		ta.Spec.Container = &flytev1.ContainerSpec{Image: image, Command: []string{"sh", "-c", "true"}}
		return ta
	}, func(ta *flytev1.TaskAction) bool { return ta.Status.Phase == flytev1.PhaseSucceeded })
	if err != nil {
		return res, fmt.Errorf("real node, actions: %w", err)
	}
	return res, nil
}

// createAndWait creates o.RealNodeActions objects made by newObject from o.Creators clients
// and waits, through a watch on list's kind in ns, until each is done. A failed object
// fails the run.
func createAndWait[T client.Object](ctx context.Context, wc client.WithWatch, ns string, o Options, list client.ObjectList,
	newObject func(int) T, done func(T) bool) (realRun, error) {
	started := time.Now()
	created, finished, err := watchUntilDone(ctx, wc, ns, o, list, newObject, done)
	if err != nil {
		return realRun{}, err
	}
	r := realRun{perSecond: float64(o.RealNodeActions) / time.Since(started).Seconds()}
	for name, t := range finished {
		r.latency = append(r.latency, t.Sub(created[name]))
	}
	return r, nil
}

// watchUntilDone is createAndWait's creating and watching: it returns when each object
// was created and when it was seen done.
func watchUntilDone[T client.Object](ctx context.Context, wc client.WithWatch, ns string, o Options, list client.ObjectList,
	newObject func(int) T, done func(T) bool) (_, finished map[string]time.Time, err error) {
	w, err := wc.Watch(ctx, list, client.InNamespace(ns))
	if err != nil {
		return nil, nil, err
	}
	defer func() { w.Stop() }()
	finished = map[string]time.Time{}
	var (
		created map[string]time.Time
		first   error
		wg      sync.WaitGroup
	)
	wg.Go(func() {
		created, first = createAll(o.RealNodeActions, o.Creators, func(i int) (string, time.Time, error) {
			obj := newObject(i)
			t := time.Now()
			return obj.GetName(), t, wc.Create(ctx, obj)
		})
	})
	timeout := time.After(10 * time.Minute)
	for len(finished) < o.RealNodeActions {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The server ends watches now and then; one without a resource version
				// starts again with every object, so nothing is missed.
				if w, err = wc.Watch(ctx, list, client.InNamespace(ns)); err != nil {
					return nil, nil, err
				}
				continue
			}
			if ev.Type == watch.Error {
				return nil, nil, fmt.Errorf("watching: %v", ev.Object)
			}
			if obj, isT := ev.Object.(T); isT && ev.Type != watch.Deleted && done(obj) {
				if _, seen := finished[obj.GetName()]; !seen {
					finished[obj.GetName()] = time.Now()
				}
			}
		case <-timeout:
			wg.Wait()
			return nil, nil, fmt.Errorf("only %d of %d done", len(finished), o.RealNodeActions)
		}
	}
	wg.Wait()
	return created, finished, first
}

func (r realNodeResult) write(w io.Writer) {
	fmt.Fprintf(w, "### Container actions on a real node: %d\n\n", r.actions)
	fmt.Fprintln(w, "| run | per second | executor / plain client | creation to Succeeded: p50 | p99 |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	fmt.Fprintf(w, "| pods by a plain client | %.1f | | %s | %s |\n", r.pods.perSecond, r.pods.percentile(0.5), r.pods.percentile(0.99))
	fmt.Fprintf(w, "| container actions by the executor | %.1f | %.0f%% | %s | %s |\n", r.executor.perSecond,
		100*r.executor.perSecond/r.pods.perSecond, r.executor.percentile(0.5), r.executor.percentile(0.99))
	fmt.Fprintln(w)
}
