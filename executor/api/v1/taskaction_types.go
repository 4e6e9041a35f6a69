package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TaskActionSpec says what to run. It cannot change once the action exists: a different
// task is a different action. Every field that can grow is bounded, with the numbers of
// limits.go (a marker cannot name a constant; TestSpecLimitsMatchTheCRD compares them).
//
// +kubebuilder:validation:XValidation:rule="self.taskType != 'container' || has(self.container)",message="taskType container needs a container section"
// +kubebuilder:validation:XValidation:rule="!has(self.timeout) || duration(self.timeout) > duration('0s')",message="timeout must be positive"
// +kubebuilder:validation:XValidation:rule="!has(self.secrets) || !has(self.envVars) || self.secrets.all(s, !has(s.env) || !(s.env in self.envVars))",message="a secret's env name is also a key of envVars"
// +kubebuilder:validation:XValidation:rule="(has(self.container) && has(self.container.command) ? self.container.command.map(s, size(s)).sum() : 0) + (has(self.container) && has(self.container.args) ? self.container.args.map(s, size(s)).sum() : 0) + (has(self.container) && has(self.container.env) ? self.container.env.map(e, size(e.name) + (has(e.value) ? size(e.value) : 0)).sum() : 0) + (has(self.envVars) ? self.envVars.map(k, size(k) + size(self.envVars[k])).sum() : 0) + (has(self.config) ? self.config.map(k, size(k) + size(self.config[k])).sum() : 0) + (has(self.podTemplate) && has(self.podTemplate.metadata) && has(self.podTemplate.metadata.annotations) ? self.podTemplate.metadata.annotations.map(k, size(k) + size(self.podTemplate.metadata.annotations[k])).sum() : 0) + (has(self.secrets) ? self.secrets.map(s, has(s.mountPath) ? size(s.mountPath) : 0).sum() : 0) <= 262144",message="the spec's texts are at most 262144 characters together: command, args, env, envVars, config and annotations (names and values), and secrets' mountPaths"
type TaskActionSpec struct {
	// Project groups runs of one team or product.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Project string `json:"project"`

	// Domain separates environments of a project, such as development or production.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Domain string `json:"domain"`

	// RunName is the run this action belongs to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	RunName string `json:"runName"`

	// ActionName names the action within its run.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	ActionName string `json:"actionName"`

	// ParentActionName is the action that started this one, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	ParentActionName string `json:"parentActionName,omitempty"`

	// TaskName is the task's identity, such as "my.module.train"; the cache key uses it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$`
	TaskName string `json:"taskName"`

	// TaskType selects the plugin that runs the action, such as "container" or "core-sleep".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$`
	TaskType string `json:"taskType"`

	// InputURI is where the action's inputs are, if it has any.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	InputURI string `json:"inputUri,omitempty"`

	// RunOutputBase is the prefix under which the run's actions write their outputs.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	RunOutputBase string `json:"runOutputBase"`

	// Retries is how many times a user failure is retried, each as a new attempt.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	Retries int32 `json:"retries,omitempty"`

	// Interruptible lets the action run on preemptible capacity; once it has had the
	// executor's k8s.interruptibleFailureThreshold system failures, its next attempts
	// run on on-demand capacity.
	// +optional
	Interruptible bool `json:"interruptible,omitempty"`

	// Timeout bounds one attempt; the action ends TimedOut when it is exceeded.
	// +optional
	// +kubebuilder:validation:XValidation:rule="size(self) <= 64",message="timeout is at most 64 characters"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// Cache makes the action's outputs reusable by identical actions.
	// +optional
	Cache *CacheSpec `json:"cache,omitempty"`

	// EnvVars are set in the task's environment.
	// +optional
	// +kubebuilder:validation:MaxProperties=128
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 256)",message="envVars names are at most 256 characters"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 32768)",message="envVars values are at most 32768 characters"
	EnvVars map[string]string `json:"envVars,omitempty"`

	// ServiceAccountName runs the task's pods under this service account; when empty the
	// executor's default, and then the namespace's, applies.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Container describes the container of a container task.
	// +optional
	Container *ContainerSpec `json:"container,omitempty"`

	// Secrets are Kubernetes Secrets of the action's namespace that the kubelet delivers
	// to the task's containers, as environment variables or files. The executor only
	// names them in the objects it creates: it never reads a Secret.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(a, !has(a.env) || self.exists_one(b, has(b.env) && b.env == a.env))",message="env names must be unique"
	// +kubebuilder:validation:XValidation:rule="self.all(a, !has(a.mountPath) || self.exists_one(b, has(b.mountPath) && a.mountPath.startsWith(b.mountPath) && (size(a.mountPath) == size(b.mountPath) || a.mountPath.charAt(size(b.mountPath)) == '/')))",message="mountPaths must be unique and not nested inside one another"
	Secrets []TaskSecret `json:"secrets,omitempty"`

	// Config holds plugin settings, such as core-sleep's "duration".
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317)",message="config keys are at most 317 characters"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 32768)",message="config values are at most 32768 characters"
	Config map[string]string `json:"config,omitempty"`

	// PodTemplateName names a PodTemplate, labelled flyte.org/pod-template=true, that the
	// pods of a Kubernetes task start from: looked up in the action's namespace, then in
	// the executor's. It replaces the executor's k8s.defaultPodTemplateName; a name
	// that is found in neither fails the action (PodTemplateNotFound).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PodTemplateName string `json:"podTemplateName,omitempty"`

	// PodTemplate changes this action's pods only, merged over the named or default
	// PodTemplate; the action's own fields (container, env, resources) win over both.
	// +optional
	PodTemplate *PodTemplate `json:"podTemplate,omitempty"`
}

// PodTemplate is a fragment of a PodTemplateSpec. Its spec is checked when the executor
// builds the action's first pod, strictly (an unknown field is an error), rather than
// by the API server: the schema of a whole PodSpec would make this CRD 660 KB, past the
// 256 KB that `kubectl apply` can record.
type PodTemplate struct {
	// Metadata holds labels and annotations for the pods.
	// +optional
	Metadata PodTemplateMetadata `json:"metadata,omitempty"`

	// Spec is a corev1.PodSpec fragment. A container named "default" applies to the
	// task's container, as does one named "task"; sidecars go in initContainers, with
	// restartPolicy Always.
	// It only adds to the pod: it sets only the fields the executor's
	// k8s.inlinePodTemplateFields lists (not nodeName, tolerations, priorityClassName or
	// the service account, by default), references no Secret (spec.secrets does),
	// takes over no container or volume of the template's or the executor's, and what
	// it touches, merged, may not ask for what Pod Security's baseline level forbids
	// (host namespaces, privileged containers, hostPath volumes, added capabilities),
	// unless the executor is configured otherwise (k8s.inlinePodTemplateLevel). At most
	// 64 KiB.
	// +optional
	// +kubebuilder:validation:Type=object
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	Spec runtime.RawExtension `json:"spec,omitempty"`
}

// PodTemplateMetadata is what a PodTemplate may set of its pods' metadata.
type PodTemplateMetadata struct {
	// Labels go on the pods; the executor's own labels win over them.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317)",message="label keys are at most 317 characters"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 63)",message="label values are at most 63 characters"
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations go on the pods.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317)",message="annotation keys are at most 317 characters"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 32768)",message="annotation values are at most 32768 characters"
	Annotations map[string]string `json:"annotations,omitempty"`
}

// CacheSpec makes an action's outputs reusable.
//
// +kubebuilder:validation:XValidation:rule="!self.enabled || size(self.version) > 0",message="an enabled cache needs a version"
// +kubebuilder:validation:XValidation:rule="!has(self.overwrite) || !self.overwrite || self.enabled",message="overwrite writes the cache: it needs enabled"
type CacheSpec struct {
	// Enabled looks the outputs up before running and stores them after.
	Enabled bool `json:"enabled"`

	// Version is bumped by the task's author to invalidate older outputs.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[\x21-\x7e]*$`
	Version string `json:"version,omitempty"`

	// Serializable makes identical actions wait for one another instead of running at
	// once: the first to start reserves the computation.
	// +optional
	Serializable bool `json:"serializable,omitempty"`

	// IgnoredInputs are left out of the inputs' hash.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=256
	// +listType=set
	IgnoredInputs []string `json:"ignoredInputs,omitempty"`

	// Overwrite runs the action whatever the cache holds and replaces the entry with its
	// outputs: the cache is written, never read (a run's "overwrite cache"). A
	// serializable action still reserves the computation first.
	// +optional
	Overwrite bool `json:"overwrite,omitempty"`
}

// TaskSecret delivers a Secret of the action's namespace to the task: one key as an
// environment variable (env), or one key or every key as files in a directory
// (mountPath).
//
// +kubebuilder:validation:XValidation:rule="has(self.env) != has(self.mountPath)",message="set exactly one of env and mountPath"
// +kubebuilder:validation:XValidation:rule="!has(self.env) || has(self.key)",message="env needs a key: an environment variable holds one key of the Secret"
type TaskSecret struct {
	// Name is the Secret's name, in the action's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// Key is one key of the Secret. Without it, the whole Secret is mounted, a file per
	// key, which only mountPath can do.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +kubebuilder:validation:XValidation:rule="self != '.' && self != '..' && !self.startsWith('..')",message="a key is not '.' or '..' and does not start with '..'"
	Key string `json:"key,omitempty"`

	// Env is the environment variable that holds the key's value.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('FLYTE_')",message="env names starting with FLYTE_ are the executor's own"
	Env string `json:"env,omitempty"`

	// MountPath is an absolute directory where the kubelet mounts the Secret read-only:
	// the key's file is <mountPath>/<key>, or every key is a file there. Written without
	// a trailing slash, empty, '.' or '..' segments, so that paths compare as written.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^(/[^/]+)+$`
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(s, s == '.' || s == '..')",message="mountPath has no '.' or '..' segments"
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 4096",message="mountPath is at most 4096 bytes"
	MountPath string `json:"mountPath,omitempty"`
}

// ContainerSpec describes the container of a container task.
//
// +kubebuilder:validation:XValidation:rule="(has(self.command) ? self.command.map(s, size(s)).sum() : 0) + (has(self.args) ? self.args.map(s, size(s)).sum() : 0) <= 131072",message="command and args are at most 131072 characters together"
type ContainerSpec struct {
	// Image is the container image.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image"`

	// Command is the entrypoint; the image's when empty.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=32768
	Command []string `json:"command,omitempty"`

	// Args are the entrypoint's arguments.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=32768
	Args []string `json:"args,omitempty"`

	// Env is set in the container, after the executor's own variables.
	// +optional
	// +kubebuilder:validation:MaxItems=128
	// +kubebuilder:validation:items:XValidation:rule="size(self.name) <= 256",message="env names are at most 256 characters"
	// +kubebuilder:validation:items:XValidation:rule="!has(self.value) || size(self.value) <= 32768",message="env values are at most 32768 characters"
	// +kubebuilder:validation:items:XValidation:rule="!has(self.valueFrom) || [has(self.valueFrom.secretKeyRef), has(self.valueFrom.configMapKeyRef), has(self.valueFrom.fieldRef), has(self.valueFrom.resourceFieldRef), has(self.valueFrom.fileKeyRef)].filter(x, x).size() <= 1",message="valueFrom has one source: Kubernetes refuses more"
	// +kubebuilder:validation:items:XValidation:rule="!has(self.valueFrom) || ((!has(self.valueFrom.secretKeyRef) || (size(self.valueFrom.secretKeyRef.key) <= 253 && (!has(self.valueFrom.secretKeyRef.name) || size(self.valueFrom.secretKeyRef.name) <= 253))) && (!has(self.valueFrom.configMapKeyRef) || (size(self.valueFrom.configMapKeyRef.key) <= 253 && (!has(self.valueFrom.configMapKeyRef.name) || size(self.valueFrom.configMapKeyRef.name) <= 253))) && (!has(self.valueFrom.fieldRef) || (size(self.valueFrom.fieldRef.fieldPath) <= 253 && (!has(self.valueFrom.fieldRef.apiVersion) || size(self.valueFrom.fieldRef.apiVersion) <= 253))) && (!has(self.valueFrom.resourceFieldRef) || (size(self.valueFrom.resourceFieldRef.resource) <= 253 && (!has(self.valueFrom.resourceFieldRef.containerName) || size(self.valueFrom.resourceFieldRef.containerName) <= 253) && (!has(self.valueFrom.resourceFieldRef.divisor) || type(self.valueFrom.resourceFieldRef.divisor) == int || size(self.valueFrom.resourceFieldRef.divisor) <= 253))) && (!has(self.valueFrom.fileKeyRef) || (size(self.valueFrom.fileKeyRef.key) <= 253 && size(self.valueFrom.fileKeyRef.path) <= 253 && size(self.valueFrom.fileKeyRef.volumeName) <= 253)))",message="the names in valueFrom are at most 253 characters"
	Env []corev1.EnvVar `json:"env,omitempty"`

	// Resources are the container's requests and limits; the executor's defaults fill
	// what is missing.
	// +optional
	// +kubebuilder:validation:XValidation:rule="(!has(self.limits) || size(self.limits) <= 16) && (!has(self.requests) || size(self.requests) <= 16)",message="resources' limits and requests name at most 16 resources each"
	// +kubebuilder:validation:XValidation:rule="(!has(self.limits) || self.limits.all(k, size(k) <= 317)) && (!has(self.requests) || self.requests.all(k, size(k) <= 317))",message="resource names are at most 317 characters"
	// +kubebuilder:validation:XValidation:rule="!has(self.limits) || self.limits.all(k, type(self.limits[k]) == int || size(self.limits[k]) <= 64)",message="quantities are at most 64 characters"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || self.requests.all(k, type(self.requests[k]) == int || size(self.requests[k]) <= 64)",message="quantities are at most 64 characters"
	// +kubebuilder:validation:XValidation:rule="!has(self.claims) || size(self.claims) <= 16",message="resources' claims are at most 16"
	// +kubebuilder:validation:XValidation:rule="!has(self.claims) || self.claims.all(c, size(c.name) <= 253 && (!has(c.request) || size(c.request) <= 253))",message="claim names are at most 253 characters"
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// Phase is where an action is in its life.
// +kubebuilder:validation:Enum=Queued;WaitingForResources;Initializing;Running;Succeeded;Failed;Aborted;TimedOut
type Phase string

// The phases; the last four are terminal.
const (
	PhaseQueued              Phase = "Queued"
	PhaseWaitingForResources Phase = "WaitingForResources"
	PhaseInitializing        Phase = "Initializing"
	PhaseRunning             Phase = "Running"
	PhaseSucceeded           Phase = "Succeeded"
	PhaseFailed              Phase = "Failed"
	PhaseAborted             Phase = "Aborted"
	PhaseTimedOut            Phase = "TimedOut"
)

// Phases lists every phase, in the order an attempt moves through them, the terminal
// ones last (as the Enum marker above, which cannot name them, lists them).
func Phases() []Phase {
	return []Phase{PhaseQueued, PhaseWaitingForResources, PhaseInitializing, PhaseRunning,
		PhaseSucceeded, PhaseFailed, PhaseAborted, PhaseTimedOut}
}

// IsTerminal reports whether an action in this phase is finished: the one rule of it
// for the CRD's phases (the events contract's phases have theirs in events/store).
func (p Phase) IsTerminal() bool {
	switch p {
	case PhaseSucceeded, PhaseFailed, PhaseAborted, PhaseTimedOut:
		return true
	}
	return false
}

// Condition types of a TaskAction. Every one carries the reason and message of the
// action's last change of phase. Progressing and Failed are the executor's first; the
// others are what tools we did not write read: Succeeded as Tekton's (Unknown, True,
// False), Reconciling, Stalled and Ready as kstatus (Flux, kpt) reads them, and
// Finished for kubectl wait on an end either way (docs/executor.md, "Conditions").
const (
	// ConditionProgressing is True while the action is not finished, False after.
	ConditionProgressing = "Progressing"
	// ConditionSucceeded is Unknown while the action is not finished, True once it
	// succeeded and False once it failed, was aborted or timed out.
	ConditionSucceeded = "Succeeded"
	// ConditionFailed is True once the action failed, was aborted or timed out, and
	// absent otherwise.
	ConditionFailed = "Failed"
	// ConditionFinished is False while the action is not finished and True once it is,
	// whatever its end.
	ConditionFinished = "Finished"
	// ConditionReady is True once the action succeeded and False otherwise.
	ConditionReady = "Ready"
	// ConditionReconciling is True while the action is not finished, and absent after
	// (kstatus: InProgress).
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True once the action failed, was aborted or timed out, and
	// absent otherwise (kstatus: Failed).
	ConditionStalled = "Stalled"
)

// Condition reasons of a TaskAction.
const (
	ReasonQueued              = "Queued"
	ReasonWaitingForResources = "WaitingForResources"
	ReasonWaitingForCache     = "WaitingForCache"
	ReasonInitializing        = "Initializing"
	ReasonRunning             = "Running"
	ReasonRetrying            = "Retrying"
	ReasonAttemptFailed       = "AttemptFailed"
	ReasonSucceeded           = "Succeeded"
	ReasonCacheHit            = "CacheHit"
	ReasonInvalidSpec         = "InvalidSpec"
	ReasonStorageNotAllowed   = "StorageNotAllowed"
	// ReasonProjectNotOfNamespace: the action names a project or domain its namespace
	// is not of (see the executor's tenancy settings). It ends the action before
	// anything runs and, being the namespace's doing, not the project's, writes no
	// history: nothing of it reaches the events service.
	ReasonProjectNotOfNamespace = "ProjectNotOfNamespace"
	ReasonUnknownTaskType       = "UnknownTaskType"
	ReasonUserError             = "UserError"
	ReasonSystemError           = "SystemError"
	ReasonRetriesExhausted      = "RetriesExhausted"
	ReasonAborted               = "Aborted"
	ReasonTimedOut              = "TimedOut"
	// ReasonEventsBacklog: the action has not started because too many finished
	// actions' history waits for the events service (the executor's
	// eventsBacklog.maxUndeliveredFinished). It is the Progressing condition's reason
	// of a Queued action with no history yet; the action starts, with no one touching
	// it, once that history is delivered. Nothing of the wait reaches the events
	// service until then: an entry for it would add to the backlog it waits on.
	ReasonEventsBacklog = "EventsBacklog"
)

// ErrorKind says whose fault a failure is, which decides the budget it spends.
// +kubebuilder:validation:Enum=User;System
type ErrorKind string

// The error kinds.
const (
	ErrorKindUser   ErrorKind = "User"
	ErrorKindSystem ErrorKind = "System"
)

// ExecutionError says why an attempt failed.
type ExecutionError struct {
	// Code is a short machine-readable cause, such as "OOMKilled".
	// +kubebuilder:validation:MaxLength=256
	Code string `json:"code"`
	// Kind says whose fault it is.
	Kind ErrorKind `json:"kind"`
	// Message explains the failure to a person.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
}

// CacheStatus says what the cache did for an action.
// +kubebuilder:validation:Enum=Disabled;Miss;Hit;Populated;PutFailure;Skipped
type CacheStatus string

// The cache statuses.
const (
	CacheDisabled   CacheStatus = "Disabled"
	CacheMiss       CacheStatus = "Miss"
	CacheHit        CacheStatus = "Hit"
	CachePopulated  CacheStatus = "Populated"
	CachePutFailure CacheStatus = "PutFailure"
	CacheSkipped    CacheStatus = "Skipped"
)

// PhaseTransition is one entry of an action's phase history.
type PhaseTransition struct {
	// Phase entered.
	Phase Phase `json:"phase"`
	// Attempt during which it was entered.
	Attempt int32 `json:"attempt"`
	// Reason is a short CamelCase cause.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
	// Message explains it.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// OccurredAt is when the executor saw it, to the microsecond: several phases can
	// pass within a second.
	OccurredAt metav1.MicroTime `json:"occurredAt"`
	// Version numbers the entries of one attempt from 0, so that each entry is a
	// distinct event even when a phase recurs. It is one more than the attempt's
	// previous entry's, whatever the history has dropped or folded.
	// +optional
	Version int32 `json:"version,omitempty"`
	// Count is how many times in a row the attempt entered this phase for this reason
	// (a wait refused again and again); repeats replace the entry rather than add one,
	// so that a long wait costs one entry. Absent means once.
	// +optional
	// +kubebuilder:validation:Minimum=1
	Count int32 `json:"count,omitempty"`
	// Error is the failure that led here, for failed or retried attempts.
	// +optional
	Error *ExecutionError `json:"error,omitempty"`
	// OutputsURI is where the outputs are, on success.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	OutputsURI string `json:"outputsUri,omitempty"`
	// CacheStatus is what the cache had done by then.
	// +optional
	CacheStatus CacheStatus `json:"cacheStatus,omitempty"`
	// LogLinks point at the attempt's logs.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	LogLinks []LogLink `json:"logLinks,omitempty"`
	// ClusterEvents are the Kubernetes events seen for the attempt's objects since the
	// previous entry (the newest ones, at most 10).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	ClusterEvents []ClusterEvent `json:"clusterEvents,omitempty"`
}

// ClusterEvent is a Kubernetes event about one of an attempt's objects.
type ClusterEvent struct {
	// OccurredAt is when it was last seen.
	OccurredAt metav1.Time `json:"occurredAt"`
	// Object is "Kind/name".
	// +kubebuilder:validation:MaxLength=512
	Object string `json:"object"`
	// Type is Normal or Warning.
	// +kubebuilder:validation:MaxLength=32
	Type string `json:"type,omitempty"`
	// Reason is the event's short cause.
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
	// Message is the event's text.
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// Count is how often it was seen.
	// +optional
	Count int32 `json:"count,omitempty"`
	// Source is the component that reported it, such as "kubelet" or
	// "default-scheduler".
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Source string `json:"source,omitempty"`
}

// LogLink points at logs of an attempt.
type LogLink struct {
	// Name labels the link, such as "Kubernetes".
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// URI is where the logs are.
	// +kubebuilder:validation:MaxLength=2048
	URI string `json:"uri"`
}

// PluginState is what a plugin keeps between reconciles.
type PluginState struct {
	// Version is the plugin's state format version.
	Version int32 `json:"version"`
	// Data is the plugin's encoded state.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	Data []byte `json:"data,omitempty"`
}

// TaskActionStatus is what the executor observed and did.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.phaseHistory) || (has(self.phaseHistory) && size(self.phaseHistory) >= size(oldSelf.phaseHistory))",message="phaseHistory is append-only"
type TaskActionStatus struct {
	// Phase is the action's current phase.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Conditions: Progressing (True while the action is not finished), Succeeded
	// (Unknown until it finishes, then True or False), Failed (True once it failed, was
	// aborted or timed out), Finished (True once it finished, either way), Ready (True
	// once it succeeded), Reconciling (True while it is not finished) and Stalled (True
	// once it failed, was aborted or timed out). Reconciling, Stalled and Failed are
	// absent when not True.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Attempts is the number of the current attempt, from 1; every relaunch, after a user
	// or a system failure, is a new attempt.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// SystemFailures counts failures of the platform, which have their own budget
	// (maxSystemFailures).
	// +optional
	SystemFailures int32 `json:"systemFailures,omitempty"`

	// UserFailures counts failed attempts of the task itself, which spend spec.retries.
	// +optional
	UserFailures int32 `json:"userFailures,omitempty"`

	// PluginPhase is the plugin's own phase name, and PluginPhaseVersion orders changes
	// within it.
	// +optional
	PluginPhase string `json:"pluginPhase,omitempty"`
	// +optional
	PluginPhaseVersion int32 `json:"pluginPhaseVersion,omitempty"`

	// PluginState is the plugin's state between reconciles.
	// +optional
	PluginState *PluginState `json:"pluginState,omitempty"`

	// PhaseHistory lists every phase entered, oldest first; it only grows. Its entries are
	// also the action's events: the executor delivers them to the events service, and an
	// entry stays here after delivery; the executor keeps in memory how far it has
	// delivered.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	PhaseHistory PhaseHistory `json:"phaseHistory,omitempty"`

	// Error is the last failure, if any.
	// +optional
	Error *ExecutionError `json:"error,omitempty"`

	// CacheStatus says what the cache did.
	// +optional
	CacheStatus CacheStatus `json:"cacheStatus,omitempty"`

	// OutputsURI is where the outputs are, once the action succeeded.
	// +optional
	OutputsURI string `json:"outputsUri,omitempty"`

	// NextAttemptAt is when the next attempt may start, during a backoff.
	// +optional
	NextAttemptAt *metav1.Time `json:"nextAttemptAt,omitempty"`

	// AttemptStartedAt is when the current attempt started, after its backoff: what
	// spec.timeout is measured from.
	// +optional
	AttemptStartedAt *metav1.Time `json:"attemptStartedAt,omitempty"`

	// StartedAt is when the first attempt started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// CompletedAt is when the action reached a terminal phase.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
}

// TaskAction is one action of a run, executed by the plugin its task type selects.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ta,categories=flyte
// +kubebuilder:selectablefield:JSONPath=`.status.phase`
// +kubebuilder:selectablefield:JSONPath=`.spec.project`
// +kubebuilder:selectablefield:JSONPath=`.spec.runName`
// +kubebuilder:printcolumn:name="Run",type=string,JSONPath=`.spec.runName`
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.spec.actionName`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.taskType`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Attempts",type=integer,JSONPath=`.status.attempts`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TaskAction struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is immutable once the action exists.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
	Spec TaskActionSpec `json:"spec"`

	// +optional
	Status TaskActionStatus `json:"status,omitempty"`
}

// TaskActionList is a list of TaskActions.
//
// +kubebuilder:object:root=true
type TaskActionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TaskAction `json:"items"`
}

func init() {
	SchemeBuilder.Register(&TaskAction{}, &TaskActionList{})
}
