// Package k8s adapts plugins that run actions as Kubernetes objects (a Pod, a Job, a
// custom resource) to the core plugin interface. Such a plugin only builds its object
// and maps the object's status to a phase; the PluginManager does the rest the same way
// for every one of them: naming the object after the action and attempt, labeling it,
// owning it, applying the cluster's defaults, creating it, observing it through the
// informer cache, and deleting it on abort.
package k8s

import (
	"context"
	"strings"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// Plugin builds and reads one kind of object.
type Plugin interface {
	// BuildIdentityResource returns an empty object of the plugin's kind (type meta
	// only); the manager fills in name and namespace to look it up.
	BuildIdentityResource(ctx context.Context, md core.TaskExecutionMetadata) (client.Object, error)
	// BuildResource returns the object to create for the attempt.
	BuildResource(ctx context.Context, tCtx core.TaskExecutionContext) (client.Object, error)
	// GetTaskPhase maps the object's current state to a phase. It runs on every
	// reconcile, so it must be cheap and make no network calls.
	GetTaskPhase(ctx context.Context, tCtx core.TaskExecutionContext, obj client.Object) (core.PhaseInfo, error)
	// GetProperties tunes how the manager treats the plugin's objects.
	GetProperties() Properties
}

// EventReader is implemented by a Plugin whose objects can be stuck in a way only their
// Kubernetes events tell: a pod whose Secret volume cannot be mounted stays Pending, its
// containers "ContainerCreating", and only the kubelet's FailedMount events say why.
type EventReader interface {
	// PhaseFromEvents refines GetTaskPhase's answer info for obj. events lists the
	// Kubernetes events about obj, oldest first. It reads them from the API server (once
	// per pass, however often it is called), so call it only while the phase may depend
	// on them, and ask to be called again (RequeueAfter) while it may: events do not wake
	// an action.
	PhaseFromEvents(ctx context.Context, tCtx core.TaskExecutionContext, obj client.Object, info core.PhaseInfo,
		events func() ([]corev1.Event, error)) (core.PhaseInfo, error)
}

// AttemptFinalizer is implemented by a Plugin that keeps something of its own for an
// attempt beside its object, as the container plugin's staged mounts: the manager calls
// it when the attempt is finalized (it ended, failed, or was aborted), after the object.
type AttemptFinalizer interface {
	FinalizeAttempt(ctx context.Context, tCtx core.TaskExecutionContext) error
}

// Properties tune the manager for one core.
type Properties struct {
	// DisableInjectOwnerReferences leaves the owner reference off, for objects that
	// must outlive their action or cannot be owned by it. They are still found by name
	// and checked by label, but their changes no longer wake the action: it sees them at
	// its next requeue.
	DisableInjectOwnerReferences bool
}

// PluginEntry registers a Kubernetes core.
type PluginEntry struct {
	// ID names the plugin uniquely.
	ID string
	// RegisteredTaskTypes are the task types it runs.
	RegisteredTaskTypes []string
	// ResourceToWatch is an object of the kind the plugin creates; the executor watches
	// that kind (only the objects it manages) and reconciles their owning actions.
	ResourceToWatch client.Object
	// Plugin builds and reads the objects.
	Plugin Plugin
	// Load, when set, builds the plugin when the executor starts, instead of Plugin: for
	// a plugin that reads the cluster beyond the object it is given (through setup's
	// readers), as k8s-job reads its Job's pods.
	Load func(setup core.SetupContext) (Plugin, error)
	// IsDefault runs the plugin for task types nobody claims.
	IsDefault bool
}

// Config holds the cluster-wide defaults the manager applies to every object.
type Config struct {
	// DefaultCPURequest and DefaultMemoryRequest fill containers that request nothing.
	DefaultCPURequest, DefaultMemoryRequest resource.Quantity
	// DefaultLabels and DefaultAnnotations go on every object.
	DefaultLabels, DefaultAnnotations map[string]string
	// InterruptibleTolerations and InterruptibleNodeSelector place interruptible
	// actions' pods on preemptible nodes.
	InterruptibleTolerations  []corev1.Toleration
	InterruptibleNodeSelector map[string]string
	// InjectFinalizer puts the executor's finalizer on every object, so that it cannot
	// vanish (and take its status with it) before the executor has read its outcome.
	InjectFinalizer bool
	// DeleteOnFinalize deletes an attempt's object once the attempt is over; by default
	// it stays (its logs with it) until the TaskAction goes.
	DeleteOnFinalize bool
	// ImagePullGracePeriod is how long a pod may fail to pull its image before the
	// attempt fails as a user error.
	ImagePullGracePeriod time.Duration
	// MissingSecretGracePeriod is how long an attempt's object may refer to a Secret or
	// key that does not exist before the attempt fails as a user error.
	MissingSecretGracePeriod time.Duration
	// MountFileStorage mounts an action's file:// input and output directory into its
	// pods, for a single-node cluster whose executor runs on the node.
	MountFileStorage bool
	// LogLinks are templates of links to an attempt's logs (text/template over
	// LogLinkData), such as a cluster's log viewer.
	LogLinks []LogLinkTemplate
	// PodTemplates says which PodTemplates shape the pods of container and k8s-job
	// actions (see package podtemplate).
	PodTemplates podtemplate.Config
}

// LogLinkTemplate makes one log link.
type LogLinkTemplate struct {
	Name     string
	Template *template.Template
}

// LogLinkData is what a log link template may use.
type LogLinkData struct {
	Namespace, PodName, ContainerName string
	Project, Domain, Run, Action      string
	Attempt                           int32
}

// Links renders the templates; a template that fails is left out. (The reconciler leaves
// out any link that is not an absolute URI, whichever plugin made it.)
func (c Config) Links(data LogLinkData) []core.LogLink {
	var out []core.LogLink
	for _, t := range c.LogLinks {
		var b strings.Builder
		if err := t.Template.Execute(&b, data); err == nil {
			out = append(out, core.LogLink{Name: t.Name, URI: b.String()})
		}
	}
	return out
}

// Finalizer is the finalizer the manager puts on objects when Config.InjectFinalizer.
const Finalizer = "flyte.org/object-finalizer"

// DefaultConfig is what the executor applies when not configured otherwise.
func DefaultConfig() Config {
	return Config{
		DefaultCPURequest:    resource.MustParse("100m"),
		DefaultMemoryRequest: resource.MustParse("128Mi"),
	}
}
