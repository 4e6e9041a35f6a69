// Package k8s adapts plugins that run actions as Kubernetes objects (a Pod, a Job, a
// custom resource) to the core plugin interface. Such a plugin only builds its object
// and maps the object's status to a phase; the PluginManager does the rest the same way
// for every one of them: naming the object after the action and attempt, labeling it,
// owning it, applying the cluster's defaults, creating it, observing it through the
// informer cache, and deleting it on abort.
package k8s

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
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

// PluginEntry registers a Kubernetes plugin.
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

// Finalizer is the finalizer the manager puts on objects when Config.InjectFinalizer.
const Finalizer = "flyte.org/object-finalizer"
