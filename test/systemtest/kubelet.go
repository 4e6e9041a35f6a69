package systemtest

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// standInNode is the node the stand-in kubelet says it is.
const standInNode = "chaos-node"

// Kubelet stands in for a node, as the executor's own envtest tests do: it binds the
// executor's pods to itself, marks them Running, and after a while Succeeded or Failed as
// the test planned; a pod deleted gracefully it finishes as terminated by the
// signal and then removes, as a kubelet does at the end of the grace period.
type Kubelet struct {
	c client.Client
	// pods are the pods that exist now (a test's watch of them).
	pods func() []*corev1.Pod
	// exitCode says how an action's attempt ends: the test's plan.
	exitCode func(action string, attempt int) int32
	// leave writes what an action's container leaves in its staged output, before its
	// pod ends as exitCode says.
	leave func(action string, pod *corev1.Pod) error
	// RunFor is how long an action's container runs, at least and at most; nil is 0.5
	// to 4 s for every action.
	RunFor func(action string) (minRun, maxRun time.Duration)

	mu     sync.Mutex
	rnd    *rand.Rand
	timers map[types.UID]time.Time // when a pod's next step is due
}

// NewKubelet plays the node for the pods that pods returns, ending each action's attempts
// as exitCode says, after leave; seed draws its waits.
func NewKubelet(c client.Client, pods func() []*corev1.Pod, seed uint64, exitCode func(string, int) int32, leave func(string, *corev1.Pod) error) *Kubelet {
	return &Kubelet{c: c, pods: pods, exitCode: exitCode, leave: leave, rnd: rand.New(rand.NewPCG(seed, 0x6b75626c)), timers: map[types.UID]time.Time{}}
}

// Run takes a step on every pod each tick until ctx ends; a step that fails (the API
// server is down, the pod changed) is tried again on the next tick.
func (k *Kubelet) Run(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, p := range k.pods() {
			k.step(ctx, p)
		}
	}
}

// due reports whether the pod's next step may run, starting a random wait of up to max
// the first time it is asked.
func (k *Kubelet) due(p *corev1.Pod, minWait, maxWait time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	at, ok := k.timers[p.UID]
	if !ok {
		at = time.Now().Add(minWait + time.Duration(k.rnd.Int64N(int64(maxWait-minWait)+1)))
		k.timers[p.UID] = at
	}
	if time.Now().Before(at) {
		return false
	}
	delete(k.timers, p.UID)
	return true
}

func (k *Kubelet) step(ctx context.Context, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	terminal := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	switch {
	case p.DeletionTimestamp != nil && p.Spec.NodeName == "":
		// The API server removes an unscheduled pod at once; nothing to do.
	case p.DeletionTimestamp != nil:
		// Stopped by the deletion: the container got SIGTERM, then the pod goes.
		if !terminal {
			if k.due(p, 200*time.Millisecond, time.Second) {
				k.setStatus(ctx, p, corev1.PodFailed, &corev1.ContainerStateTerminated{ExitCode: 143, Reason: "Error"})
			}
			return
		}
		zero := int64(0)
		err := k.c.Delete(ctx, p, &client.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
		_ = client.IgnoreNotFound(err)
	case p.Spec.NodeName == "":
		if k.due(p, 0, 300*time.Millisecond) {
			err := k.c.SubResource("binding").Create(ctx, p, &corev1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
				Target:     corev1.ObjectReference{Kind: "Node", Name: standInNode}})
			_ = ignoreConflict(err)
		}
	case p.Status.Phase == corev1.PodPending || p.Status.Phase == "":
		if k.due(p, 100*time.Millisecond, time.Second) {
			k.setStatus(ctx, p, corev1.PodRunning, nil)
		}
	case p.Status.Phase == corev1.PodRunning:
		minRun, maxRun := 500*time.Millisecond, 4*time.Second
		if k.RunFor != nil {
			minRun, maxRun = k.RunFor(p.Labels[core.LabelTaskAction])
		}
		if k.due(p, minRun, maxRun) {
			attempt, _ := strconv.Atoi(p.Labels[core.LabelAttempt])
			if err := k.leave(p.Labels[core.LabelTaskAction], p); err != nil {
				return // the next tick tries again
			}
			code := k.exitCode(p.Labels[core.LabelTaskAction], attempt)
			phase, reason := corev1.PodSucceeded, "Completed"
			if code != 0 {
				phase, reason = corev1.PodFailed, "Error"
			}
			k.setStatus(ctx, p, phase, &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason})
		}
	}
}

// setStatus writes the pod's phase and its container's state, as the node would; a
// conflict means the pod changed, and the next tick sees the change.
func (k *Kubelet) setStatus(ctx context.Context, p *corev1.Pod, phase corev1.PodPhase, terminated *corev1.ContainerStateTerminated) {
	p = p.DeepCopy()
	p.Status.Phase = phase
	now := metav1.Now()
	state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	if terminated != nil {
		terminated.FinishedAt = now
		state = corev1.ContainerState{Terminated: terminated}
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: flytek8s.ContainerName, Image: "busybox:1.36", State: state, Ready: terminated == nil}}
	if p.Status.StartTime == nil {
		p.Status.StartTime = &now
	}
	_ = ignoreConflict(k.c.Status().Update(ctx, p))
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
