// Package flytek8s is the plugin machinery for plugins whose objects run an action's
// container (Flyte's pluginmachinery/flytek8s): the task's pod as the action describes
// it (environment, mounted file storage, secrets, pod templates), what the pod's status
// says of the attempt (phases, exit codes, missing Secrets), and the outcome the task
// left behind. The container plugin runs this pod as it is; k8s-job wraps it in a Job.
package flytek8s

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
	"github.com/flytekube/backend/executor/storage"
	"github.com/flytekube/backend/executor/tasksecrets"
)

// ContainerName is the name of the task's container in its Pod.
const ContainerName = "task"

// Environment variables every task container gets.
const (
	EnvInputURI     = "FLYTE_INPUT_URI"
	EnvOutputPrefix = "FLYTE_OUTPUT_PREFIX"
	EnvAttempt      = "FLYTE_ATTEMPT"
	EnvProject      = "FLYTE_PROJECT"
	EnvDomain       = "FLYTE_DOMAIN"
	EnvRun          = "FLYTE_RUN"
	EnvAction       = "FLYTE_ACTION"
)

// NewTaskPods returns the task pods of cfg, reading PodTemplates with templates (nil
// reads none).
func NewTaskPods(cfg k8s.Config, templates client.Reader) TaskPods {
	return TaskPods{Config: cfg, Templates: podtemplate.Source{Config: cfg.Config, Reader: templates}}
}

// TaskPods builds the pods that run actions' containers, and reads them.
type TaskPods struct {
	// Config supplies the log link templates, grace periods and file storage setting.
	Config k8s.Config
	// Templates are the PodTemplates task pods start from.
	Templates podtemplate.Source
}

// Build makes the pod of the action's current attempt: its container with the
// executor's environment, the mounted file storage (with k8s.mountFileStorage), the
// action's secrets, laid over its pod templates.
func (p TaskPods) Build(ctx context.Context, tCtx core.TaskExecutionContext) (*corev1.Pod, error) {
	md := tCtx.Metadata()
	spec := md.Action().Spec
	if spec.Container == nil || spec.Container.Image == "" {
		return nil, errors.New("a container task needs spec.container.image")
	}
	// The outcome is read back from the attempt's output prefix: a location the data
	// store refuses fails the action now, at its first pass, rather than after its pod
	// ran, as a system failure each time the outcome is looked for.
	if err := storage.Check(tCtx.DataStore(), tCtx.OutputWriter().OutputsURI(), false); err != nil {
		return nil, fmt.Errorf("container: spec.runOutputBase: the executor may not read the attempt's outcome: %w", err)
	}
	env := []corev1.EnvVar{
		{Name: EnvInputURI, Value: tCtx.InputReader().InputURI()},
		{Name: EnvOutputPrefix, Value: tCtx.OutputWriter().OutputPrefix()},
		{Name: EnvAttempt, Value: strconv.Itoa(int(md.Attempt()))},
		{Name: EnvProject, Value: spec.Project}, {Name: EnvDomain, Value: spec.Domain},
		{Name: EnvRun, Value: spec.RunName}, {Name: EnvAction, Value: spec.ActionName},
	}
	for _, k := range slices.Sorted(maps.Keys(spec.EnvVars)) {
		env = append(env, corev1.EnvVar{Name: k, Value: spec.EnvVars[k]})
	}
	env = append(env, spec.Container.Env...)
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		Spec: corev1.PodSpec{
			RestartPolicy:      corev1.RestartPolicyNever,
			ServiceAccountName: md.ServiceAccountName(),
			Containers: []corev1.Container{{
				Name: ContainerName, Image: spec.Container.Image, Command: spec.Container.Command, Args: spec.Container.Args,
				Env: env, Resources: *spec.Container.Resources.DeepCopy(),
			}},
		},
	}
	if p.Config.MountFileStorage {
		if err := mountFileStorage(ctx, tCtx, &pod.Spec); err != nil {
			return nil, err
		}
	}
	// After the executor's own variables and mounts, which the secrets may not shadow.
	if err := tasksecrets.Apply(&pod.Spec, spec.Secrets, ContainerName); err != nil {
		return nil, err
	}
	if err := p.applyTemplates(ctx, md.Action(), pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// applyTemplates lays pod over the action's PodTemplates: the named or default one,
// then its inline fragment. A template the action cannot run with fails it, with the
// template's code; a failed read of the cache is retried.
func (p TaskPods) applyTemplates(ctx context.Context, action *flytev1.TaskAction, pod *corev1.Pod) error {
	base, err := p.Templates.Base(ctx, action)
	if err != nil {
		return templateError(err)
	}
	inline, err := p.Templates.Inline(action)
	if err != nil {
		return templateError(err)
	}
	// The fragment goes over the template only where it adds: pod is what the
	// executor built, whose volumes it may not mount again.
	merged, err := p.Templates.LayInline(base, inline, pod, ContainerName)
	if err != nil {
		return templateError(err)
	}
	if merged == nil {
		return nil
	}
	if err := podtemplate.Apply(merged, pod, ContainerName); err != nil {
		return templateError(err)
	}
	// A pod ends when all its containers have: a second one that serves the task would
	// keep it running after the task ended. Kubernetes' sidecars stop with the task.
	if len(pod.Spec.Containers) > 1 {
		return k8s.BadSpec(podtemplate.CodeInvalid, fmt.Errorf("the pod template adds the container %q beside the task's: "+
			"put a sidecar in initContainers with restartPolicy: Always, which stops when the task does", pod.Spec.Containers[1].Name))
	}
	return nil
}

// templateError gives a template's problem its code, and marks anything else (a read
// of the cache) transient.
func templateError(err error) error {
	var perr *podtemplate.Error
	if errors.As(err, &perr) {
		return k8s.BadSpec(perr.Code, err)
	}
	return core.Transient(fmt.Errorf("container: %w", err))
}

// Names of the volumes that mount an action's file:// data.
const (
	InputsVolume  = "flyte-inputs"
	OutputsVolume = "flyte-outputs"
)

// mountFileStorage mounts the action's file:// input (read-only) and its attempt's output
// directory at the paths their URIs name, so that the task finds them where the
// environment says. What is mounted is staged for the attempt (see storage.HostPathStore):
// no pod can redirect another's mount, nor write in the data store itself.
func mountFileStorage(ctx context.Context, tCtx core.TaskExecutionContext, spec *corev1.PodSpec) error {
	store, ok := hostPaths(tCtx)
	if !ok {
		return errors.New("container: k8s.mountFileStorage is set, but the data store is not on this machine's disk")
	}
	attempt := attemptID(tCtx.Metadata())
	mount := func(name, uri string, readOnly bool) error {
		if !strings.HasPrefix(uri, "file://") {
			return nil
		}
		stage, kind := store.StageOutput, corev1.HostPathDirectory
		if readOnly {
			stage, kind = store.StageInput, corev1.HostPathFile
		}
		m, err := stage(ctx, uri, attempt)
		if errors.Is(err, storage.ErrTooLarge) {
			return k8s.BadSpec(CodeInputsTooLarge, fmt.Errorf("container: mounting %s: %w", uri, err))
		}
		if err != nil {
			return fmt.Errorf("container: mounting %s: %w", uri, err)
		}
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: m.Source, Type: &kind}}})
		c := &spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: m.Target, ReadOnly: readOnly})
		return nil
	}
	if err := mount(InputsVolume, tCtx.InputReader().InputURI(), true); err != nil {
		return err
	}
	return mount(OutputsVolume, tCtx.OutputWriter().OutputPrefix(), false)
}

// hostPaths is the action's data store when file storage is mounted.
func hostPaths(tCtx core.TaskExecutionContext) (storage.HostPathStore, bool) {
	store, ok := tCtx.DataStore().(storage.HostPathStore)
	return store, ok
}

// attemptID names the attempt's staged mounts: unique across actions and attempts.
func attemptID(md core.TaskExecutionMetadata) string {
	return fmt.Sprintf("%s-%d", md.Action().UID, md.Attempt())
}

// CollectOutputs moves what the attempt's pods wrote to its output URI, with
// k8s.mountFileStorage; call it only once they have all stopped.
func (p TaskPods) CollectOutputs(ctx context.Context, tCtx core.TaskExecutionContext) error {
	uri := tCtx.OutputWriter().OutputPrefix()
	store, ok := hostPaths(tCtx)
	if !p.Config.MountFileStorage || !ok || !strings.HasPrefix(uri, "file://") {
		return nil
	}
	if err := store.CollectOutput(ctx, uri, attemptID(tCtx.Metadata())); err != nil {
		return fmt.Errorf("container: collecting the outputs: %w", err)
	}
	return nil
}

// OutputsTooLarge fails, for good and as the user's error, an attempt whose pods left an
// output tree over the data store's bounds (CollectOutputs' error): collecting it again
// would meet the same bound.
func OutputsTooLarge(err error) core.PhaseInfo {
	return core.PhaseInfoPermanentFailure(core.ErrorKindUser, CodeOutputsTooLarge, "container: the outputs are not collected: "+err.Error())
}

// FinalizeAttempt removes the attempt's staged mounts (k8s.AttemptFinalizer).
func (p TaskPods) FinalizeAttempt(ctx context.Context, tCtx core.TaskExecutionContext) error {
	store, ok := hostPaths(tCtx)
	if !p.Config.MountFileStorage || !ok {
		return nil
	}
	attempt := attemptID(tCtx.Metadata())
	for _, uri := range []string{tCtx.InputReader().InputURI(), tCtx.OutputWriter().OutputPrefix()} {
		if !strings.HasPrefix(uri, "file://") {
			continue
		}
		if err := store.Unstage(ctx, uri, attempt); err != nil {
			return fmt.Errorf("container: removing the staged mounts: %w", err)
		}
	}
	return nil
}

// Phase is what pod, the attempt's, says of it, with the configured log links.
func (p TaskPods) Phase(ctx context.Context, tCtx core.TaskExecutionContext, pod *corev1.Pod) (core.PhaseInfo, error) {
	info, err := p.phaseOf(ctx, tCtx, pod)
	if err == nil && len(p.Config.LogLinks) > 0 {
		spec := tCtx.Metadata().Action().Spec
		info.LogLinks = p.Config.Links(k8s.LogLinkData{
			Namespace: pod.Namespace, PodName: pod.Name, ContainerName: ContainerName,
			Project: spec.Project, Domain: spec.Domain, Run: spec.RunName, Action: spec.ActionName, Attempt: tCtx.Metadata().Attempt(),
		})
	}
	return info, err
}

func (p TaskPods) phaseOf(ctx context.Context, tCtx core.TaskExecutionContext, pod *corev1.Pod) (core.PhaseInfo, error) {
	cfg := p.Config
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		// Its containers have stopped: nothing writes in the staged output any more.
		if err := p.CollectOutputs(ctx, tCtx); errors.Is(err, storage.ErrTooLarge) {
			return OutputsTooLarge(err), nil
		} else if err != nil {
			return core.PhaseInfo{}, err
		}
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return Outcome(ctx, tCtx)
	case corev1.PodFailed:
		// Stopped by a deletion, preemption, eviction or node shutdown, the kubelet marks
		// a pod Failed (its container exits on SIGTERM or SIGKILL), but the task did not
		// fail: FailureOf makes that a system failure. Its containers have stopped, so a
		// new attempt cannot run beside it.
		return FailureOf(pod), nil
	}
	if pod.DeletionTimestamp != nil {
		// A pod being deleted gracefully has not failed: it may still finish, and a new
		// attempt must not start beside it. The manager relaunches once it is gone.
		reason, message, _ := disrupted(pod)
		info := core.PhaseInfoRunning(1, reason)
		info.Message = message
		return info, nil
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		return core.PhaseInfoRunning(0, "Running"), nil
	default: // Pending or unknown
		return pending(pod, tCtx.Metadata().Action().Spec.Secrets, tCtx.Metadata().Now(), cfg), nil
	}
}

// disrupted reports whether something other than the task stopped (or is stopping) the
// pod: a deletion, with reason Preempted when Kubernetes marked it a disruption target,
// or the kubelet's eviction or node shutdown.
func disrupted(pod *corev1.Pod) (reason, message string, ok bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return "Preempted", cmp.Or(c.Message, c.Reason), true
		}
	}
	switch pod.Status.Reason {
	case "Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated":
		return pod.Status.Reason, pod.Status.Message, true
	}
	if pod.DeletionTimestamp != nil {
		return "Terminating", fmt.Sprintf("pod %s is being deleted", pod.Name), true
	}
	return "", "", false
}

// Waiting reasons of a container whose image cannot be had: a name that can never be an
// image fails at once; a failed pull, after the grace period (a registry may be back).
var (
	badImage    = map[string]bool{"InvalidImageName": true, "ErrImageNeverPull": true}
	failedPulls = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true}
)

// CodeMissingSecret is the error code of an attempt whose pod refers to a Secret, or a
// key of one, that does not exist.
const CodeMissingSecret = "MissingSecret"

func pending(pod *corev1.Pod, secrets []flytev1.TaskSecret, now time.Time, cfg k8s.Config) core.PhaseInfo {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return core.PhaseInfoWaitingForResources(0, "Unschedulable", c.Message)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		w := cs.State.Waiting
		if w == nil || w.Reason == "" || w.Reason == "ContainerCreating" {
			continue
		}
		if badImage[w.Reason] || failedPulls[w.Reason] && now.Sub(pod.CreationTimestamp.Time) >= cfg.ImagePullGracePeriod.Duration {
			// Nothing the platform can do: the task names an image that is not there,
			// or that this node may not pull.
			return core.PhaseInfoPermanentFailure(core.ErrorKindUser, "ImagePullFailed",
				fmt.Sprintf("container %s cannot start: %s: %s", cs.Name, w.Reason, w.Message))
		}
		if failed, ok := MissingSecretOfContainer(cs, secrets); ok {
			return MissingSecretAfterGrace(failed, pod.CreationTimestamp.Time, now, cfg.MissingSecretGracePeriod.Duration)
		}
		return core.PhaseInfoInitializing(0, w.Reason, w.Message)
	}
	if pod.Spec.NodeName == "" {
		// Not on a node yet: still what its creation reported, which keeps the action's
		// status as it is, so that this pass writes nothing.
		return core.PhaseInfoQueued(k8s.ReasonObjectCreated)
	}
	return core.PhaseInfoInitializing(0, "Pending", "")
}

// MissingSecretOfContainer reports, as the attempt's failure for good, a container of a
// task's pod that cannot start because a Secret or key of secrets does not exist: it
// waits with reason CreateContainerConfigError, which the kubelet retries forever, though
// only someone creating the Secret could make it work.
func MissingSecretOfContainer(cs corev1.ContainerStatus, secrets []flytev1.TaskSecret) (core.PhaseInfo, bool) {
	w := cs.State.Waiting
	if w == nil || w.Reason != "CreateContainerConfigError" {
		return core.PhaseInfo{}, false
	}
	what, ok := tasksecrets.Missing(secrets, w.Message)
	if !ok {
		return core.PhaseInfo{}, false
	}
	return core.PhaseInfoPermanentFailure(core.ErrorKindUser, CodeMissingSecret,
		fmt.Sprintf("container %s cannot start: %s: %s: %s", cs.Name, what, w.Reason, w.Message)), true
}

// SecretMountRecheck is how often the events of a pod that may be waiting for a Secret
// volume are read again: nothing else wakes its action while it waits.
const SecretMountRecheck = 10 * time.Second

// PhaseFromEvents refines info, a pod's phase, with the pod's events (k8s.EventReader).
// The user's failure of a failed pod becomes a system one when an event reports a fault
// of the node's devices (deviceFaultOf). A pod whose Secret volume cannot be mounted
// stays Pending with its containers "ContainerCreating", and its status never says why:
// only the kubelet's FailedMount events do. While a pod with Secret volumes may still be
// mounting them, they are read, and read again after SecretMountRecheck.
func (p TaskPods) PhaseFromEvents(ctx context.Context, tCtx core.TaskExecutionContext, obj client.Object, info core.PhaseInfo,
	events func() ([]corev1.Event, error)) (core.PhaseInfo, error) {
	secrets := tCtx.Metadata().Action().Spec.Secrets
	pod, ok := obj.(*corev1.Pod)
	if ok && len(p.Config.DeviceFaultRules) > 0 && usersFailureOfPod(pod, info) {
		return p.deviceFaultOf(ctx, tCtx, pod, info, events)
	}
	if !ok || info.Phase != core.PhaseInitializing || !MountingSecrets(pod, secrets) {
		return info, nil
	}
	// Without the events, the only word on it, wait and read them again.
	info.RequeueAfter = RecheckSecretMount(info.RequeueAfter)
	if list, err := events(); err == nil {
		if failed, ok := MissingSecretOfMount(pod, secrets, list); ok {
			return MissingSecretAfterGrace(failed, pod.CreationTimestamp.Time, tCtx.Metadata().Now(), p.Config.MissingSecretGracePeriod.Duration), nil
		}
	}
	return info, nil
}

// ReasonWaitingForSecret is the reason of an attempt whose pod refers to a Secret or key
// that does not exist yet, while it is younger than k8s.Config.MissingSecretGracePeriod.
const ReasonWaitingForSecret = "WaitingForSecret"

// MissingSecretAfterGrace returns failed, the MissingSecret failure of an object created
// at created, once the object is grace old; until then, a wait saying the same and
// asking to be called again when the grace ends. A Secret that a controller syncs (from
// an external secret manager, say) may appear moments after the action that names it,
// and nothing else wakes the action when it does.
func MissingSecretAfterGrace(failed core.PhaseInfo, created, now time.Time, grace time.Duration) core.PhaseInfo {
	left := grace - now.Sub(created)
	if left <= 0 {
		return failed
	}
	info := core.PhaseInfoInitializing(0, ReasonWaitingForSecret, failed.Message)
	info.RequeueAfter = min(left, SecretMountRecheck)
	return info
}

// RecheckSecretMount is the wait before the next look at a pod that may be waiting for a
// Secret volume, given the wait asked for so far (0 for none).
func RecheckSecretMount(requeueAfter time.Duration) time.Duration {
	if requeueAfter == 0 || requeueAfter > SecretMountRecheck {
		return SecretMountRecheck
	}
	return requeueAfter
}

// MissingSecretOfMount reports, as the attempt's failure for good, a pod whose events
// (oldest first) hold a FailedMount of the kubelet saying that a Secret or key of secrets
// does not exist.
func MissingSecretOfMount(pod *corev1.Pod, secrets []flytev1.TaskSecret, events []corev1.Event) (core.PhaseInfo, bool) {
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		if e.Reason != "FailedMount" {
			continue
		}
		if what, ok := tasksecrets.Missing(secrets, e.Message); ok {
			return core.PhaseInfoPermanentFailure(core.ErrorKindUser, CodeMissingSecret,
				fmt.Sprintf("pod %s cannot start: %s: %s: %s", pod.Name, what, e.Reason, e.Message)), true
		}
	}
	return core.PhaseInfo{}, false
}

// MountingSecrets reports whether pod, on its node and not yet started, mounts Secret
// volumes of spec.secrets and may still be waiting for them: the kubelet mounts a pod's
// volumes before it creates its sandbox, so a pod ready to start containers has them.
func MountingSecrets(pod *corev1.Pod, secrets []flytev1.TaskSecret) bool {
	if pod.Spec.NodeName == "" || pod.Status.Phase != corev1.PodPending || pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
			return false
		}
	}
	for _, s := range secrets {
		if s.MountPath != "" {
			return true
		}
	}
	return false
}

// Codes of attempts that failed because the task left more than the data store takes
// (datastore.Limits): the user's error, for good.
const (
	CodeErrorDocumentTooLarge = "ErrorDocumentTooLarge"
	CodeOutputsTooLarge       = "OutputsTooLarge"
	CodeInputsTooLarge        = "InputsTooLarge"
)

// errorDocument is what a task writes to its error URI to report a user error.
type errorDocument struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Outcome reads what a task that exited cleanly left behind: an error document at the
// attempt's error URI makes it a user failure, otherwise it succeeded (with outputs if
// it wrote them).
func Outcome(ctx context.Context, tCtx core.TaskExecutionContext) (core.PhaseInfo, error) {
	out := tCtx.OutputWriter()
	if store := tCtx.DataStore(); store != nil {
		raw, err := store.Read(ctx, out.ErrorURI())
		switch {
		case err == nil:
			var doc errorDocument
			if jerr := json.Unmarshal(raw, &doc); jerr != nil || doc.Code == "" {
				doc = errorDocument{Code: "UserError", Message: string(raw)}
			}
			return core.PhaseInfoUserFailure(doc.Code, doc.Message), nil
		case storage.IsNotAllowed(err):
			return notAllowed(err), nil
		case errors.Is(err, storage.ErrTooLarge):
			// Read whole, it would take the executor down: the task chose its size.
			return core.PhaseInfoPermanentFailure(core.ErrorKindUser, CodeErrorDocumentTooLarge,
				"container: the error document is not read: "+err.Error()), nil
		case !errors.Is(err, storage.ErrNotFound):
			return core.PhaseInfo{}, fmt.Errorf("container: reading the error document: %w", err)
		}
		// Success is recorded, and cached, with what this says: an error is never taken
		// for "no outputs". A store's bad moment is transient (see datastore), so the
		// pass runs again after a backoff without charging the action.
		ok, err := store.Exists(ctx, out.OutputsURI())
		if storage.IsNotAllowed(err) {
			return notAllowed(err), nil
		}
		if err != nil {
			return core.PhaseInfo{}, fmt.Errorf("container: checking for the outputs: %w", err)
		}
		if ok {
			return core.PhaseInfoSuccess(out.OutputsURI()), nil
		}
	}
	return core.PhaseInfoSuccess(""), nil
}

// notAllowed fails an attempt whose outcome lies where the data store may not look
// (its configuration changed since the pod was made, say): looking again cannot help.
func notAllowed(err error) core.PhaseInfo {
	return core.PhaseInfoPermanentFailure(core.ErrorKindUser, "OutputsNotAllowed", "container: reading the outcome: "+err.Error())
}
