package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrUnknownTaskType is returned by Resolve when no plugin runs a task type.
var ErrUnknownTaskType = errors.New("no plugin runs this task type")

// Registry maps task types to plugins. Entries are registered first, then Initialize
// loads every plugin once and fixes the mapping; Resolve is safe for concurrent use.
type Registry struct {
	log *slog.Logger

	mu            sync.RWMutex
	entries       []Entry
	plugins       map[string]Plugin // by task type
	byID          map[string]Plugin
	defaultPlugin Plugin
	initialized   bool
}

// NewRegistry returns an empty registry.
func NewRegistry(log *slog.Logger) *Registry {
	if log == nil {
		log = slog.Default()
	}
	return &Registry{log: log}
}

// Register adds an entry; it must come before Initialize.
func (r *Registry) Register(e Entry) error {
	if e.ID == "" {
		return errors.New("plugin: an entry needs an ID")
	}
	if e.LoadPlugin == nil {
		return fmt.Errorf("plugin %s: an entry needs LoadPlugin", e.ID)
	}
	if len(e.RegisteredTaskTypes) == 0 && !e.IsDefault {
		return fmt.Errorf("plugin %s: an entry needs task types or IsDefault", e.ID)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.initialized {
		return fmt.Errorf("plugin %s: registered after Initialize", e.ID)
	}
	if slices.ContainsFunc(r.entries, func(o Entry) bool { return o.ID == e.ID }) {
		return fmt.Errorf("plugin %s: registered twice", e.ID)
	}
	r.entries = append(r.entries, e)
	return nil
}

// Initialize loads every registered plugin and maps task types to them, then applies
// defaultForTaskTypes (task type to plugin ID), which wins over registrations. When two
// plugins claim a task type, or two are the default, the later one wins and a warning is
// logged.
func (r *Registry) Initialize(ctx context.Context, setup SetupContext, defaultForTaskTypes map[string]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.initialized {
		return errors.New("plugin: registry initialized twice")
	}
	plugins := make(map[string]Plugin)
	byID := make(map[string]Plugin)
	owner := make(map[string]string) // task type -> plugin ID, for the collision warning
	var defaultPlugin Plugin
	for _, e := range r.entries {
		p, err := e.LoadPlugin(ctx, setup)
		if err != nil {
			return fmt.Errorf("plugin %s: loading: %w", e.ID, err)
		}
		if p == nil {
			return fmt.Errorf("plugin %s: LoadPlugin returned no plugin", e.ID)
		}
		if _, ok := p.(resourceToWatch); ok {
			return fmt.Errorf("plugin %s: declares the kind it watches with a ResourceToWatch method, which the executor does not read; "+
				"set Entry.Watches (k8s.PluginEntry.ResourceToWatch) instead, which also keeps that kind's informer to the objects the executor manages", e.ID)
		}
		byID[e.ID] = p
		for _, tt := range e.RegisteredTaskTypes {
			if prev, taken := owner[tt]; taken {
				r.log.Warn("task type registered by two plugins; the later one runs it",
					"taskType", tt, "previous", prev, "plugin", e.ID)
			}
			plugins[tt], owner[tt] = p, e.ID
		}
		if e.IsDefault {
			if defaultPlugin != nil {
				r.log.Warn("two default plugins; the later one is the default",
					"previous", defaultPlugin.GetID(), "plugin", e.ID)
			}
			defaultPlugin = p
		}
	}
	for tt, id := range defaultForTaskTypes {
		p, ok := byID[id]
		if !ok {
			return fmt.Errorf("defaultForTaskTypes: task type %q names plugin %q, which is not registered", tt, id)
		}
		plugins[tt] = p
	}
	r.plugins, r.byID, r.defaultPlugin, r.initialized = plugins, byID, defaultPlugin, true
	return nil
}

// resourceToWatch is how plugins once declared the kind they watch, beside the entry:
// two sources that could disagree, and a kind watched this way alone was cached for the
// whole cluster. Entry.Watches is the only source now, and a plugin with the method is
// refused rather than silently not watched.
type resourceToWatch interface{ ResourceToWatch() client.Object }

// Watches returns an object of each kind the registered entries watch (Entry.Watches),
// one per kind, in the order registered. It needs no Initialize: the manager's cache is
// configured from it (restricting these kinds' informers to managed objects) before the
// plugins are loaded, and the controller's watches come from it too, so the two agree.
func (r *Registry) Watches() []client.Object {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []client.Object
	seen := map[reflect.Type]bool{}
	for _, e := range r.entries {
		if e.Watches == nil || seen[reflect.TypeOf(e.Watches)] {
			continue
		}
		seen[reflect.TypeOf(e.Watches)] = true
		out = append(out, e.Watches)
	}
	return out
}

// Resolve returns the plugin that runs a task type: the one registered for it, else the
// default plugin, else ErrUnknownTaskType.
func (r *Registry) Resolve(taskType string) (Plugin, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !r.initialized {
		return nil, errors.New("plugin: registry used before Initialize")
	}
	if p, ok := r.plugins[taskType]; ok {
		return p, nil
	}
	if r.defaultPlugin != nil {
		return r.defaultPlugin, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownTaskType, taskType)
}

// Plugin returns a loaded plugin by ID.
func (r *Registry) Plugin(id string) (Plugin, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p, ok := r.byID[id]
	return p, ok
}

// Plugins returns every loaded plugin.
func (r *Registry) Plugins() []Plugin {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Plugin, 0, len(r.byID))
	for _, p := range r.byID {
		out = append(out, p)
	}
	return out
}
