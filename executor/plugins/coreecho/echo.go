// Package coreecho is the core-echo plugin: it copies the action's inputs document to its
// outputs. It is the smallest real task, with inputs and outputs, which makes it handy
// for cache tests and benchmarks.
package coreecho

import (
	"context"
	"errors"
	"fmt"

	"github.com/flytekube/backend/executor/plugin"
)

// ID is the plugin's ID and task type.
const ID = "core-echo"

// Entry registers the plugin.
func Entry() plugin.Entry { return plugin.CoreEntry(Plugin{}) }

// Plugin echoes.
type Plugin struct{}

var _ plugin.Plugin = Plugin{}

// GetID implements plugin.Plugin.
func (Plugin) GetID() string { return ID }

// GetProperties implements plugin.Plugin.
func (Plugin) GetProperties() plugin.Properties { return plugin.Properties{} }

// Handle implements plugin.Plugin. Writing the same outputs again is harmless, so a
// repeated call after a conflict or a restart is idempotent.
func (Plugin) Handle(ctx context.Context, tCtx plugin.TaskExecutionContext) (plugin.Transition, error) {
	in, err := tCtx.InputReader().Read(ctx)
	switch {
	case errors.Is(err, plugin.ErrNotFound):
		return plugin.DoTransition(plugin.PhaseInfoPermanentFailure(plugin.ErrorKindUser, "InputsNotFound",
			fmt.Sprintf("no inputs at %s", tCtx.InputReader().InputURI()))), nil
	case err != nil:
		return plugin.Transition{}, fmt.Errorf("core-echo: reading inputs: %w", err)
	case in == nil:
		in = []byte("{}")
	}
	uri, err := tCtx.OutputWriter().Write(ctx, in)
	if err != nil {
		return plugin.Transition{}, fmt.Errorf("core-echo: writing outputs: %w", err)
	}
	return plugin.DoTransition(plugin.PhaseInfoSuccess(uri)), nil
}

// Abort implements plugin.Plugin.
func (Plugin) Abort(context.Context, plugin.TaskExecutionContext) error { return nil }

// Finalize implements plugin.Plugin.
func (Plugin) Finalize(context.Context, plugin.TaskExecutionContext) error { return nil }
