package executor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// quotaController does the quota controller's job, which no process does in the test
// cluster: it sets a pods quota's usage to the pods that really count. The API server's
// quota admission charges each create before it stores the pod and never refunds a
// create that then fails; the controller finds such leaks by comparing the charges made
// since its last sync with the pods that appeared meanwhile.
type quotaController struct {
	ns    string
	quota client.ObjectKey
	mu    sync.Mutex // held by the test while it deletes pods, so a sync sees whole changes
	// lastUsed and lastSeen are what the last sync wrote and the pods it saw.
	lastUsed int64
	lastSeen map[string]bool
	leak     atomic.Int64
	stop     chan struct{}
	done     sync.WaitGroup
}

func startQuotaController(t *testing.T, ns string, pods int64) *quotaController {
	t.Helper()
	hard := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(pods, resource.DecimalSI)}
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "pod-cap", Namespace: ns}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}
	if err := env.Client.Create(context.Background(), quota); err != nil {
		t.Fatal(err)
	}
	q := &quotaController{ns: ns, quota: client.ObjectKeyFromObject(quota), lastSeen: map[string]bool{}, stop: make(chan struct{})}
	q.sync(t)
	q.done.Add(1)
	go func() {
		defer q.done.Done()
		for {
			select {
			case <-q.stop:
				return
			case <-time.After(50 * time.Millisecond):
				q.sync(t)
			}
		}
	}()
	t.Cleanup(func() { close(q.stop); q.done.Wait() })
	return q
}

// pods lists the namespace's pods: all their names, and how many use quota (not
// finished; a pod in its grace period still counts, as for the real controller).
func (q *quotaController) pods(ctx context.Context) (map[string]bool, int64, error) {
	var list corev1.PodList
	if err := env.Client.List(ctx, &list, client.InNamespace(q.ns)); err != nil {
		return nil, 0, err
	}
	names := map[string]bool{}
	var counted int64
	for _, p := range list.Items {
		names[p.Name] = true
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			counted++
		}
	}
	return names, counted, nil
}

func (q *quotaController) sync(t *testing.T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.syncLocked(t)
}

func (q *quotaController) syncLocked(t *testing.T) {
	ctx := context.Background()
	var cur corev1.ResourceQuota
	if err := env.Client.Get(ctx, q.quota, &cur); err != nil {
		return
	}
	charges := cur.Status.Used.Pods().Value() - q.lastUsed
	names, counted, err := q.pods(ctx)
	if err != nil {
		return
	}
	newPods := func() int64 {
		var n int64
		for name := range names {
			if !q.lastSeen[name] {
				n++
			}
		}
		return n
	}
	if charges > newPods() {
		// A create may be between its charge and its store: look again a little later.
		time.Sleep(200 * time.Millisecond)
		if names, counted, err = q.pods(ctx); err != nil {
			return
		}
		if over := charges - newPods(); over > 0 {
			q.leak.Add(over)
		}
	}
	cur.Status = corev1.ResourceQuotaStatus{Hard: cur.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(counted, resource.DecimalSI)}}
	if err := env.Client.Status().Update(ctx, &cur); err != nil {
		return // admission charged meanwhile: the next sync sees it
	}
	q.lastUsed, q.lastSeen = counted, names
}

// TestSeed004GracefulDeletionUnderAPodsQuota replays the upstream report: in a namespace
// with a pods quota of 3 and three running actions, one pod is deleted gracefully and
// held in its grace period for 20 seconds. Upstream livelocked here, re-creating the
// pod under the same name ~12 times a second, leaking quota with every failed create
// and then burning every retry on quota refusals. Here: no create at all while the pod
// terminates, no quota leak, one new pod once the old one is gone, no retry spent.
func TestSeed004GracefulDeletionUnderAPodsQuota(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	quota := startQuotaController(t, ns, 3)
	restConfig, rec := recordingConfig()
	var reconciles atomic.Int64
	start(t, testConfig(), ns, runOptions{restConfig: restConfig, count: &reconciles})

	var actions []*flytev1.TaskAction
	var pods []*corev1.Pod
	for i := range 3 {
		ta := containerAction(ns, fmt.Sprintf("s%d", i), 5) // retries to burn, as in the report
		if err := env.Client.Create(ctx, ta); err != nil {
			t.Fatal(err)
		}
		actions = append(actions, ta)
		pods = append(pods, bindAndRun(t, ta, ta.Name+"-1"))
	}
	victim, victimPod := actions[0], pods[0]

	// A plain graceful delete, as kubectl, a preempting scheduler or a drain sends it.
	createsBefore, writesBefore, reconcilesBefore := rec.count("POST pods"), rec.writes("taskactions"), reconciles.Load()
	if err := env.Client.Delete(ctx, victimPod); err != nil {
		t.Fatal(err)
	}
	waitReason(t, client.ObjectKeyFromObject(victim), "Terminating")
	hold := time.Now().Add(20 * time.Second)
	for time.Now().Before(hold) {
		var got flytev1.TaskAction
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(victim), &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != flytev1.PhaseRunning || got.Status.Attempts != 1 || got.Status.SystemFailures != 0 {
			t.Fatalf("during the grace period: %s, attempt %d, %d system failures; want Running, 1, 0",
				got.Status.Phase, got.Status.Attempts, got.Status.SystemFailures)
		}
		if n := rec.count("POST pods") - createsBefore; n != 0 {
			t.Fatalf("%d creates while the pod was terminating; want none", n)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if w := rec.writes("taskactions") - writesBefore; w > 2 {
		t.Fatalf("%d TaskAction writes during a 20s grace period; want at most 2", w)
	}
	if r := reconciles.Load() - reconcilesBefore; r > 10 {
		t.Fatalf("%d reconciles during a 20s grace period; something polls", r)
	}

	// The kubelet finishes the deletion (the container exited at last).
	quota.mu.Lock()
	err := env.Client.Delete(ctx, victimPod, client.GracePeriodSeconds(0))
	if err == nil {
		quota.syncLocked(t)
	}
	quota.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	relaunched := waitPod(t, ns, victim.Name+"-2")
	kubelet(t, relaunched, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	for _, p := range pods[1:] {
		p = waitPod(t, ns, p.Name)
		kubelet(t, p, corev1.PodSucceeded, &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	}

	got := waitSucceeded(t, client.ObjectKeyFromObject(victim))
	if got.Status.Attempts != 2 || got.Status.SystemFailures != 1 {
		t.Fatalf("attempts %d, system failures %d; want 2 and 1: the relaunch is the platform's, no user retry spent",
			got.Status.Attempts, got.Status.SystemFailures)
	}
	for _, ta := range actions[1:] {
		if other := waitSucceeded(t, client.ObjectKeyFromObject(ta)); other.Status.Attempts != 1 {
			t.Fatalf("%s took %d attempts; the others are not to be disturbed", ta.Name, other.Status.Attempts)
		}
	}
	// Exactly one pod more than the three; a create refused by a quota not yet updated
	// after the old pod went would be waited out, and is not charged.
	if c, ok := rec.count("POST pods"), rec.accepted("POST pods"); ok != 4 || c > 5 {
		t.Fatalf("%d pod creates, %d accepted; want 4 accepted: three pods and one relaunch", c, ok)
	}
	quota.sync(t)
	if l := quota.leak.Load(); l != 0 {
		t.Fatalf("quota usage rose %d above the pods that exist", l)
	}
}
