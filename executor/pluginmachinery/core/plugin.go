// Package core is the plugin machinery every plugin uses (Flyte's pluginmachinery/core):
// the interface every plugin implements, the registry that maps task types to plugins,
// and the context a plugin gets for one attempt of one action. Plugins are driven by the
// reconciler and never drive it; nothing here imports the controller.
package core

import (
	"context"

	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Plugin executes actions of the task types it is registered for.
//
// Every method may be called any number of times for the same attempt (the reconciler
// retries after conflicts and restarts), so each must be idempotent. Handle must not
// block: timed work returns a PhaseInfo with RequeueAfter instead.
type Plugin interface {
	// GetID returns the plugin's unique ID.
	GetID() string
	// GetProperties describes how the executor should treat the plugin.
	GetProperties() Properties
	// Handle advances the attempt and reports where it is.
	Handle(ctx context.Context, tCtx TaskExecutionContext) (Transition, error)
	// Abort stops the attempt's work.
	Abort(ctx context.Context, tCtx TaskExecutionContext) error
	// Finalize releases what the attempt held, after Handle reached a terminal phase or
	// after Abort.
	Finalize(ctx context.Context, tCtx TaskExecutionContext) error
}

// Properties describe how the executor should treat a plugin.
type Properties struct {
	// DisableNodeLevelCaching turns the cache off for this plugin's tasks.
	DisableNodeLevelCaching bool
	// NeedsFinalizer asks for the action's finalizer while an attempt is under way, so
	// that deleting the action runs Abort and Finalize first. Plugins whose attempts hold
	// nothing outside the action (such as core-sleep) can leave it off and save the API
	// server a write per action.
	NeedsFinalizer bool
}

// SetupContext is what a plugin may use when it is loaded.
type SetupContext interface {
	// Client reads and writes Kubernetes objects.
	Client() client.Client
	// APIReader reads straight from the API server, for the rare reads the informer
	// cache cannot answer (an object created by a pass whose result was lost).
	APIReader() client.Reader
	// Cache is the manager's informer cache, for plugins that watch objects.
	Cache() cache.Cache
	// EventRecorder records Kubernetes events.
	EventRecorder() record.EventRecorder
}

// Entry registers a plugin: its ID, the task types it runs, and how to load it.
type Entry struct {
	// ID names the plugin uniquely.
	ID string
	// RegisteredTaskTypes are the task types the plugin runs.
	RegisteredTaskTypes []string
	// LoadPlugin builds the plugin; the registry calls it once, at Initialize.
	LoadPlugin func(ctx context.Context, setup SetupContext) (Plugin, error)
	// IsDefault makes the plugin run any task type no other plugin claims.
	IsDefault bool
	// Watches is an object of the kind the plugin's attempts create in the cluster, if
	// any: the executor caches only the objects of that kind it manages, never the
	// cluster's others, and wakes an action when one of its objects changes.
	Watches client.Object
}

// CoreEntry registers an in-process plugin that needs nothing at load time, for the task
// type named like its ID.
func CoreEntry(p Plugin) Entry {
	return Entry{
		ID:                  p.GetID(),
		RegisteredTaskTypes: []string{p.GetID()},
		LoadPlugin:          func(context.Context, SetupContext) (Plugin, error) { return p, nil },
	}
}
