package chaos

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// observer keeps what the watches saw: each action's last status (the executor's own
// record of what it reported, kept after the object is gone), and every pod by name and
// by action, to catch duplicates as they happen.
type observer struct {
	mu      sync.Mutex
	actions map[string]*actionRecord
	podUIDs map[string]map[string]bool // pod name -> UIDs seen
	// actionPods are the pod UIDs seen of each action, by its name.
	actionPods map[string]map[string]bool
	alive      map[string]map[string]bool // action name -> pods existing and not finished
	pods       map[string]*corev1.Pod     // pod name -> latest version, for the kubelet and faults
	// overlaps are pods of one action seen alive at once, as they were seen.
	overlaps []string
	// ran counts pods seen whose container a runtime ran to its end (a container ID
	// and an exit code), by runtime: containerd's on a real node, none on the stand-in.
	ran     map[string]int
	ranSeen map[string]bool // pod UIDs counted
	// relisted says the actions' watch lost its place at least once and listed again:
	// what happened to an action meanwhile was not seen.
	relisted bool
}

// lostPlace says whether the actions' watch ever lost its place.
func (o *observer) lostPlace() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.relisted
}

// actionRecord is what the soak knows of one action.
type actionRecord struct {
	last    *flytev1.TaskAction // last version seen
	gone    bool                // deleted for good
	running bool                // reported Running at some point
	// endUnseen says the deletion was inferred from a new list: the watch lost its place
	// meanwhile, so the action may have written history after the last version seen.
	endUnseen bool
	// endedAt is when the watch first saw it finished.
	endedAt time.Time
}

func newObserver() *observer {
	return &observer{actions: map[string]*actionRecord{}, podUIDs: map[string]map[string]bool{}, actionPods: map[string]map[string]bool{},
		alive: map[string]map[string]bool{}, pods: map[string]*corev1.Pod{}, ran: map[string]int{}, ranSeen: map[string]bool{}}
}

// action handles a change of a TaskAction.
func (o *observer) action(ch change) {
	ta, ok := ch.obj.(*flytev1.TaskAction)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.actions[ta.Name]
	if r == nil {
		r = &actionRecord{}
		o.actions[ta.Name] = r
	}
	if ch.relisted {
		o.relisted = true
	}
	if ch.deleted {
		r.gone = true
		r.endUnseen = ch.relisted
	}
	// A deletion carries the object as it was last: keep the richer of the two.
	if r.last == nil || !ch.deleted || len(ta.Status.PhaseHistory) >= len(r.last.Status.PhaseHistory) {
		r.last = ta.DeepCopy()
	}
	if ta.Status.Phase == flytev1.PhaseRunning {
		r.running = true
	}
	if ta.Status.Phase.IsTerminal() && r.endedAt.IsZero() {
		r.endedAt = time.Now()
	}
}

// pod handles a change of a pod.
func (o *observer) pod(ch change) {
	p, ok := ch.obj.(*corev1.Pod)
	if !ok {
		return
	}
	action := p.Labels[core.LabelTaskAction]
	o.mu.Lock()
	defer o.mu.Unlock()
	if ch.deleted {
		delete(o.pods, p.Name)
		if a := o.alive[action]; a != nil {
			delete(a, p.Name)
		}
		return
	}
	o.pods[p.Name] = p.DeepCopy()
	if o.podUIDs[p.Name] == nil {
		o.podUIDs[p.Name] = map[string]bool{}
	}
	o.podUIDs[p.Name][string(p.UID)] = true
	if action == "" {
		return
	}
	if o.actionPods[action] == nil {
		o.actionPods[action] = map[string]bool{}
	}
	o.actionPods[action][string(p.UID)] = true
	a := o.alive[action]
	if a == nil {
		a = map[string]bool{}
		o.alive[action] = a
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Terminated != nil && !o.ranSeen[string(p.UID)] {
			o.ranSeen[string(p.UID)] = true
			runtime, _, _ := strings.Cut(c.ContainerID, "://")
			o.ran[runtime]++
		}
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		// Its containers have stopped: a pod that stays to be read is not running.
		delete(a, p.Name)
		return
	}
	if !a[p.Name] && len(a) > 0 {
		var others []string
		for n := range a {
			others = append(others, n)
		}
		sort.Strings(others)
		o.overlaps = append(o.overlaps, fmt.Sprintf("action %s: pod %s created while %v still existed", action, p.Name, others))
	}
	a[p.Name] = true
}

// podsOf counts the pods ever seen of an action.
func (o *observer) podsOf(action string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.actionPods[action])
}

// snapshotPods returns the pods that exist now.
func (o *observer) snapshotPods() []*corev1.Pod {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(o.pods))
	for _, p := range o.pods {
		out = append(out, p.DeepCopy())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// record returns a copy of what is known of one action.
func (o *observer) record(name string) (actionRecord, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ok := o.actions[name]
	if !ok {
		return actionRecord{}, false
	}
	c := *r
	if r.last != nil {
		c.last = r.last.DeepCopy()
	}
	return c, true
}
