// Package echo is the core-echo plugin: it copies the action's inputs document to its
// outputs. It is the smallest real task, with inputs and outputs, which makes it handy
// for cache tests and benchmarks.
package echo

import (
	"context"
	"errors"
	"fmt"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/storage"
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
// repeated call after a conflict or a restart is idempotent. The inputs are copied
// streamed when the store can (storage.Copier), never held whole: their size is the user's
// choice, bounded by the store's copy limit.
func (Plugin) Handle(ctx context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	in, out := tCtx.InputReader(), tCtx.OutputWriter()
	var err error
	copier, streamed := tCtx.DataStore().(storage.Copier)
	switch {
	case in.InputURI() == "":
		_, err = out.Write(ctx, []byte("{}"))
	case streamed:
		err = copier.Copy(ctx, in.InputURI(), out.OutputsURI())
	default:
		var data []byte
		if data, err = in.Read(ctx); err == nil {
			_, err = out.Write(ctx, data)
		}
	}
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "InputsNotFound",
			fmt.Sprintf("no inputs at %s", in.InputURI()))), nil
	case errors.Is(err, storage.ErrTooLarge):
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "InputsTooLarge",
			"core-echo: the inputs are not copied: "+err.Error())), nil
	case err != nil:
		return core.Transition{}, fmt.Errorf("core-echo: copying the inputs to the outputs: %w", err)
	}
	return core.DoTransition(core.PhaseInfoSuccess(out.OutputsURI())), nil
}

// Abort implements core.Plugin.
func (Plugin) Abort(context.Context, core.TaskExecutionContext) error { return nil }

// Finalize implements core.Plugin.
func (Plugin) Finalize(context.Context, core.TaskExecutionContext) error { return nil }
