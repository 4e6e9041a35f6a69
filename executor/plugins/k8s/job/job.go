// Package job is the Kubernetes Job plugin (task type "k8s-job"): it runs an action's
// container as a batch/v1 Job, for tasks that want a Job's parallelism and completions.
// It exists beside the container plugin to keep the Kubernetes plugin interface honest:
// the manager does the same naming, labeling, owning, creating, watching and deleting
// for a kind that is not a Pod.
package job

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/storage"
)

// ID is the plugin's ID and task type.
const ID = "k8s-job"

// Keys of spec.config the plugin reads.
const (
	ConfigParallelism = "parallelism"
	ConfigCompletions = "completions"
)

// Entry registers the core. It reads the Job's pods from the API server (they are the
// Job controller's, so not in the executor's cache) while they all wait to start.
func Entry(cfg k8s.Config) core.Entry {
	return k8s.Entry(k8s.PluginEntry{
		ID: ID, RegisteredTaskTypes: []string{ID}, ResourceToWatch: &batchv1.Job{},
		Load: func(setup core.SetupContext) (k8s.Plugin, error) {
			return Plugin{pods: flytek8s.NewTaskPods(cfg, setup.Client()), reader: setup.APIReader()}, nil
		},
	}, cfg)
}

// Plugin builds and reads task Jobs.
type Plugin struct {
	pods flytek8s.TaskPods
	// reader reads the Job's pods and their events; without it, they are not read.
	reader client.Reader
}

var (
	_ k8s.Plugin           = Plugin{}
	_ k8s.EventReader      = Plugin{}
	_ k8s.AttemptFinalizer = Plugin{}
)

// FinalizeAttempt implements k8s.AttemptFinalizer: the pods' staged mounts go.
func (p Plugin) FinalizeAttempt(ctx context.Context, tCtx core.TaskExecutionContext) error {
	return p.pods.FinalizeAttempt(ctx, tCtx)
}

// GetProperties implements k8s.Plugin.
func (Plugin) GetProperties() k8s.Properties { return k8s.Properties{} }

// BuildIdentityResource implements k8s.Plugin.
func (Plugin) BuildIdentityResource(context.Context, core.TaskExecutionMetadata) (client.Object, error) {
	return &batchv1.Job{TypeMeta: metav1.TypeMeta{Kind: "Job", APIVersion: "batch/v1"}}, nil
}

// BuildResource implements k8s.Plugin: the task pod (flytek8s), as a Job's template,
// so the Job's pods get what a task's pod gets, the action's secrets (tasksecrets.Apply)
// among it. The Job never retries a pod itself (backoffLimit 0): attempts are the
// executor's, so that each has its own name, budget and events.
func (p Plugin) BuildResource(ctx context.Context, tCtx core.TaskExecutionContext) (client.Object, error) {
	pod, err := p.pods.Build(ctx, tCtx)
	if err != nil {
		return nil, err
	}
	cfg := tCtx.Metadata().Action().Spec.Config
	parallelism, err := positive(cfg, ConfigParallelism)
	if err != nil {
		return nil, err
	}
	completions, err := positive(cfg, ConfigCompletions)
	if err != nil {
		return nil, err
	}
	// The Job's pods carry their templates' labels and annotations, then the action's
	// labels but not managed-by: they are the Job controller's, and the executor watches
	// the Job, not them.
	labels := pod.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, tCtx.Metadata().Labels())
	delete(labels, core.LabelManagedBy)
	return &batchv1.Job{
		TypeMeta: metav1.TypeMeta{Kind: "Job", APIVersion: "batch/v1"},
		Spec: batchv1.JobSpec{
			Parallelism: parallelism, Completions: completions, BackoffLimit: new(int32),
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: pod.Annotations}, Spec: pod.Spec},
		},
	}, nil
}

// positive reads an optional positive integer setting.
func positive(cfg map[string]string, key string) (*int32, error) {
	v, ok := cfg[key]
	if !ok {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("spec.config.%s must be a positive integer, not %q", key, v)
	}
	n32 := int32(n)
	return &n32, nil
}

// GetTaskPhase implements k8s.Plugin.
func (p Plugin) GetTaskPhase(ctx context.Context, tCtx core.TaskExecutionContext, obj client.Object) (core.PhaseInfo, error) {
	job, ok := obj.(*batchv1.Job)
	if !ok {
		return core.PhaseInfo{}, fmt.Errorf("k8s-job: expected a Job, got %T", obj)
	}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobFailed:
			// The Job controller sets either only once its pods have stopped.
			if err := p.pods.CollectOutputs(ctx, tCtx); errors.Is(err, storage.ErrTooLarge) {
				return flytek8s.OutputsTooLarge(err), nil
			} else if err != nil {
				return core.PhaseInfo{}, fmt.Errorf("k8s-job: %w", err)
			}
			if c.Type == batchv1.JobComplete {
				return flytek8s.Outcome(ctx, tCtx)
			}
			return p.failure(ctx, job, c)
		}
	}
	if job.DeletionTimestamp != nil {
		// As with a pod: a Job being deleted may still finish, and the next attempt must
		// not start beside it; the manager relaunches once it is gone.
		info := core.PhaseInfoRunning(1, "Terminating")
		info.Message = fmt.Sprintf("job %s is being deleted", job.Name)
		return info, nil
	}
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobSuspended && c.Status == corev1.ConditionTrue {
			return core.PhaseInfoWaitingForResources(0, "Suspended", c.Message), nil
		}
	}
	switch {
	case job.Status.Ready != nil && *job.Status.Ready > 0:
		info := core.PhaseInfoRunning(0, "Running")
		info.Message = fmt.Sprintf("%d of %d pods ready, %d succeeded", *job.Status.Ready, job.Status.Active, job.Status.Succeeded)
		return info, nil
	case job.Status.Active > 0:
		return core.PhaseInfoInitializing(0, ReasonPodsPending, fmt.Sprintf("%d pods started, none ready yet", job.Status.Active)), nil
	default:
		return core.PhaseInfoInitializing(0, "Pending", ""), nil
	}
}

// failure is the failure of a Job that failed (condition c). The Job's reason says only
// that a pod failed (BackoffLimitExceeded, since the Job never retries one), so its
// failed pods are read and classified as every task pod is
// (flytek8s.FailureOf): the same ending is the same failure whichever plugin ran the
// task, and a preempted or evicted pod is the platform's failure, not the task's. Without
// a failed pod to read, it is the user's failure under the Job's reason.
func (p Plugin) failure(ctx context.Context, job *batchv1.Job, c batchv1.JobCondition) (core.PhaseInfo, error) {
	reason := cmp.Or(c.Reason, "JobFailed")
	if p.reader != nil {
		pods, err := p.jobPods(ctx, job)
		if err != nil {
			return core.PhaseInfo{}, err
		}
		if info, ok := podsFailure(pods); ok {
			return info, nil
		}
	}
	return core.PhaseInfoUserFailure(reason, c.Message), nil
}

// podsFailure is the failure of the failed pods of a Job: a pod's user failure first (when
// a task fails, the Job controller stops the other pods, which then look disrupted), then a
// disruption other than a deletion (a preemption that failed the Job, rather than the
// deletions that followed), the first to end among equals.
func podsFailure(pods []corev1.Pod) (core.PhaseInfo, bool) {
	var best core.PhaseInfo
	var bestRank int
	var bestEnd time.Time
	found := false
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase != corev1.PodFailed {
			continue
		}
		info := flytek8s.FailureOf(pod)
		rank := 2
		switch {
		case info.Err.Kind == core.ErrorKindUser:
			rank = 0
		case info.Err.Code != "Terminating":
			rank = 1
		}
		end := endOf(pod)
		if !found || rank < bestRank || rank == bestRank && end.Before(bestEnd) {
			info.Message = fmt.Sprintf("pod %s: %s", pod.Name, info.Message)
			info.Err.Message = info.Message
			best, bestRank, bestEnd, found = info, rank, end, true
		}
	}
	return best, found
}

// endOf is when the pod's task container ended; without one, the end of time, so that a
// pod with one is preferred.
func endOf(pod *corev1.Pod) time.Time {
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; cs.Name == flytek8s.ContainerName && t != nil && !t.FinishedAt.IsZero() {
			return t.FinishedAt.Time
		}
	}
	return time.Unix(1<<40, 0)
}

// ReasonPodsPending is the reason of a Job whose pods have started, none ready yet.
const ReasonPodsPending = "PodsPending"

// PhaseFromEvents implements k8s.EventReader. The Job's status does not say why its pods
// do not start, and a Secret of the action that does not exist keeps them Pending for
// ever, as it would a task's pod. So while the Job's pods have started, none ready, the
// pods of an action with secrets are read, and for a pod that may still be mounting
// Secret volumes, its events, failing the attempt as flytek8s does for a task pod. Neither
// a pod's status nor its events wake the action (only the Job's do), so they are read
// again every flytek8s.SecretMountRecheck while that lasts.
func (p Plugin) PhaseFromEvents(ctx context.Context, tCtx core.TaskExecutionContext, obj client.Object, info core.PhaseInfo,
	_ func() ([]corev1.Event, error)) (core.PhaseInfo, error) {
	secrets := tCtx.Metadata().Action().Spec.Secrets
	job, ok := obj.(*batchv1.Job)
	if !ok || p.reader == nil || len(secrets) == 0 || info.Phase != core.PhaseInitializing || info.Reason != ReasonPodsPending {
		return info, nil
	}
	info.RequeueAfter = flytek8s.RecheckSecretMount(info.RequeueAfter)
	pods, err := p.jobPods(ctx, job)
	if err != nil {
		return info, nil // read again at the recheck
	}
	events := func(pod *corev1.Pod) ([]corev1.Event, error) { return k8s.ListEvents(ctx, p.reader, pod) }
	if failed, ok := missingSecret(pods, secrets, events); ok {
		return flytek8s.MissingSecretAfterGrace(failed, job.CreationTimestamp.Time, tCtx.Metadata().Now(), p.pods.Config.MissingSecretGracePeriod.Duration), nil
	}
	return info, nil
}

// jobPods lists the pods the Job controls, by the Job's selector, which the API server
// sets to the label the Job controller puts on its pods (batch.kubernetes.io/controller-uid,
// or controller-uid on older clusters), and by their controller reference.
func (p Plugin) jobPods(ctx context.Context, job *batchv1.Job) ([]corev1.Pod, error) {
	selector := labels.SelectorFromSet(labels.Set{batchv1.ControllerUidLabel: string(job.UID)})
	if job.Spec.Selector != nil {
		s, err := metav1.LabelSelectorAsSelector(job.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("k8s-job: the selector of job %s: %w", job.Name, err)
		}
		selector = s
	}
	var list corev1.PodList
	if err := p.reader.List(ctx, &list, client.InNamespace(job.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, fmt.Errorf("k8s-job: listing the pods of job %s: %w", job.Name, err)
	}
	var pods []corev1.Pod
	for i := range list.Items {
		if ref := metav1.GetControllerOf(&list.Items[i]); ref != nil && ref.UID == job.UID {
			pods = append(pods, list.Items[i])
		}
	}
	return pods, nil
}

// maxEventReads bounds the pods whose events are read in one pass: a Job's pods share
// one spec, so what keeps one from mounting its Secret volumes keeps them all.
const maxEventReads = 3

// missingSecret looks through a Job's pods for one that cannot start because a Secret or
// key of secrets does not exist: a container's status says so for a variable, the
// pod's FailedMount events (listed by events) for a volume.
func missingSecret(pods []corev1.Pod, secrets []flytev1.TaskSecret, events func(*corev1.Pod) ([]corev1.Event, error)) (core.PhaseInfo, bool) {
	for i := range pods {
		for _, cs := range pods[i].Status.ContainerStatuses {
			if info, ok := flytek8s.MissingSecretOfContainer(cs, secrets); ok {
				return info, true
			}
		}
	}
	reads := 0
	for i := range pods {
		pod := &pods[i]
		if reads == maxEventReads || !flytek8s.MountingSecrets(pod, secrets) {
			continue
		}
		reads++
		list, err := events(pod)
		if err != nil {
			continue // read again at the recheck
		}
		if info, ok := flytek8s.MissingSecretOfMount(pod, secrets, list); ok {
			return info, true
		}
	}
	return core.PhaseInfo{}, false
}
