// Package echo is the core-echo plugin: it copies the action's inputs document to its
// outputs. It is the smallest real task, with inputs and outputs, which makes it handy
// for cache tests and benchmarks.
package echo

import (
	"context"
	"errors"
	"fmt"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// ID is the plugin's ID and task type.
const ID = "core-echo"

// Entry registers the core.
func Entry() core.Entry { return core.CoreEntry(Plugin{}) }

// Plugin echoes.
type Plugin struct{}

var _ core.Plugin = Plugin{}

// GetID implements core.Plugin.
func (Plugin) GetID() string { return ID }

// GetProperties implements core.Plugin.
func (Plugin) GetProperties() core.Properties { return core.Properties{} }

// Handle implements core.Plugin. Writing the same outputs again is harmless, so a
// repeated call after a conflict or a restart is idempotent.
func (Plugin) Handle(ctx context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	in, err := tCtx.InputReader().Read(ctx)
	switch {
	case errors.Is(err, core.ErrNotFound):
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "InputsNotFound",
			fmt.Sprintf("no inputs at %s", tCtx.InputReader().InputURI()))), nil
	case err != nil:
		return core.Transition{}, fmt.Errorf("core-echo: reading inputs: %w", err)
	case in == nil:
		in = []byte("{}")
	}
	uri, err := tCtx.OutputWriter().Write(ctx, in)
	if err != nil {
		return core.Transition{}, fmt.Errorf("core-echo: writing outputs: %w", err)
	}
	return core.DoTransition(core.PhaseInfoSuccess(uri)), nil
}

// Abort implements core.Plugin.
func (Plugin) Abort(context.Context, core.TaskExecutionContext) error { return nil }

// Finalize implements core.Plugin.
func (Plugin) Finalize(context.Context, core.TaskExecutionContext) error { return nil }
