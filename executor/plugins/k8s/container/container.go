// Package container is the container plugin (task type "container", the default): it
// runs an action's container as a Pod, the task pod of pluginmachinery/flytek8s, and
// reads the attempt's phase from the Pod's status and the task's outcome.
package container

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
)

// ID is the plugin's ID and task type.
const ID = "container"

// Entry registers the plugin as the default one. It reads PodTemplates from the
// executor's cache.
func Entry(cfg k8s.Config) core.Entry {
	return k8s.Entry(k8s.PluginEntry{
		ID: ID, RegisteredTaskTypes: []string{ID}, ResourceToWatch: &corev1.Pod{}, IsDefault: true,
		Load: func(setup core.SetupContext) (k8s.Plugin, error) { return New(cfg, setup.Client()), nil },
	}, cfg)
}

// New returns the plugin, reading PodTemplates with templates (nil reads none).
func New(cfg k8s.Config, templates client.Reader) Plugin {
	return Plugin{Pods: flytek8s.NewTaskPods(cfg, templates)}
}

// Plugin runs the task pod.
type Plugin struct {
	Pods flytek8s.TaskPods
}

var (
	_ k8s.Plugin           = Plugin{}
	_ k8s.EventReader      = Plugin{}
	_ k8s.AttemptFinalizer = Plugin{}
)

// GetProperties implements k8s.Plugin.
func (Plugin) GetProperties() k8s.Properties { return k8s.Properties{} }

// BuildIdentityResource implements k8s.Plugin.
func (Plugin) BuildIdentityResource(context.Context, core.TaskExecutionMetadata) (client.Object, error) {
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}}, nil
}

// BuildResource implements k8s.Plugin.
func (p Plugin) BuildResource(ctx context.Context, tCtx core.TaskExecutionContext) (client.Object, error) {
	return p.Pods.Build(ctx, tCtx)
}

// GetTaskPhase implements k8s.Plugin.
func (p Plugin) GetTaskPhase(ctx context.Context, tCtx core.TaskExecutionContext, obj client.Object) (core.PhaseInfo, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return core.PhaseInfo{}, fmt.Errorf("container: expected a Pod, got %T", obj)
	}
	return p.Pods.Phase(ctx, tCtx, pod)
}

// PhaseFromEvents implements k8s.EventReader.
func (p Plugin) PhaseFromEvents(ctx context.Context, tCtx core.TaskExecutionContext, obj client.Object, info core.PhaseInfo,
	events func() ([]corev1.Event, error)) (core.PhaseInfo, error) {
	return p.Pods.PhaseFromEvents(ctx, tCtx, obj, info, events)
}

// FinalizeAttempt implements k8s.AttemptFinalizer.
func (p Plugin) FinalizeAttempt(ctx context.Context, tCtx core.TaskExecutionContext) error {
	return p.Pods.FinalizeAttempt(ctx, tCtx)
}
