// Package coresleep is the core-sleep plugin: it waits for spec.config.duration and
// succeeds. It never blocks a worker: Handle remembers when the sleep started (in the
// plugin state) and asks to be called back when it should end. With
// spec.config.failAttempts N, the first N attempts fail after their sleep with a
// retryable user error, to show retries at work without a cluster to run pods.
package coresleep

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/flytekube/backend/executor/plugin"
)

// ID is the plugin's ID and task type.
const ID = "core-sleep"

// stateVersion is the version of state's format.
const stateVersion = 1

type state struct {
	StartedAt time.Time `json:"startedAt"`
}

// Entry registers the plugin.
func Entry() plugin.Entry { return plugin.CoreEntry(Plugin{}) }

// Plugin sleeps.
type Plugin struct{}

var _ plugin.Plugin = Plugin{}

// GetID implements plugin.Plugin.
func (Plugin) GetID() string { return ID }

// GetProperties implements plugin.Plugin: a sleep holds nothing outside the action, so
// it needs no finalizer.
func (Plugin) GetProperties() plugin.Properties { return plugin.Properties{} }

// Handle implements plugin.Plugin.
func (Plugin) Handle(_ context.Context, tCtx plugin.TaskExecutionContext) (plugin.Transition, error) {
	raw := tCtx.Metadata().Action().Spec.Config["duration"]
	d, err := time.ParseDuration(raw)
	if raw == "" {
		d, err = 0, nil
	}
	if err != nil || d < 0 {
		return plugin.DoTransition(plugin.PhaseInfoPermanentFailure(plugin.ErrorKindUser, "InvalidConfig",
			fmt.Sprintf("config.duration %q is not a non-negative duration such as 2s", raw))), nil
	}
	now := tCtx.Metadata().Now()
	var st state
	if _, err := tCtx.PluginStateReader().Get(&st); err != nil {
		return plugin.Transition{}, err
	}
	if st.StartedAt.IsZero() {
		st.StartedAt = now
		if err := tCtx.PluginStateWriter().Put(stateVersion, st); err != nil {
			return plugin.Transition{}, err
		}
	}
	if remaining := st.StartedAt.Add(d).Sub(now); remaining > 0 {
		info := plugin.PhaseInfoRunning(0, "Sleeping")
		info.Message = fmt.Sprintf("sleeping %s, %s left", d, remaining.Round(time.Millisecond))
		info.RequeueAfter = remaining
		return plugin.DoTransition(info), nil
	}
	if failing := tCtx.Metadata().Action().Spec.Config["failAttempts"]; failing != "" {
		n, err := strconv.Atoi(failing)
		if err != nil || n < 0 {
			return plugin.DoTransition(plugin.PhaseInfoPermanentFailure(plugin.ErrorKindUser, "InvalidConfig",
				fmt.Sprintf("config.failAttempts %q is not a non-negative number", failing))), nil
		}
		if attempt := tCtx.Metadata().Attempt(); int(attempt) <= n {
			return plugin.DoTransition(plugin.PhaseInfoUserFailure("SimulatedFailure",
				fmt.Sprintf("attempt %d fails, as config.failAttempts (%d) asks", attempt, n))), nil
		}
	}
	return plugin.DoTransition(plugin.PhaseInfoSuccess("")), nil
}

// Abort implements plugin.Plugin: there is nothing running to stop.
func (Plugin) Abort(context.Context, plugin.TaskExecutionContext) error { return nil }

// Finalize implements plugin.Plugin: there is nothing to release.
func (Plugin) Finalize(context.Context, plugin.TaskExecutionContext) error { return nil }
