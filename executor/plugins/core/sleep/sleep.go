// Package sleep is the core-sleep plugin: it waits for spec.config.duration and
// succeeds. It never blocks a worker: Handle remembers when the sleep started (in the
// plugin state) and asks to be called back when it should end. With
// spec.config.failAttempts N, the first N attempts fail after their sleep with a
// retryable user error, to show retries at work without a cluster to run pods.
package sleep

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

// ID is the plugin's ID and task type.
const ID = "core-sleep"

// stateVersion is the version of state's format.
const stateVersion = 1

type state struct {
	StartedAt time.Time `json:"startedAt"`
}

// Entry registers the core.
func Entry() core.Entry { return core.CoreEntry(Plugin{}) }

// Plugin sleeps.
type Plugin struct{}

var _ core.Plugin = Plugin{}

// GetID implements core.Plugin.
func (Plugin) GetID() string { return ID }

// GetProperties implements core.Plugin: a sleep holds nothing outside the action, so
// it needs no finalizer.
func (Plugin) GetProperties() core.Properties { return core.Properties{} }

// Handle implements core.Plugin.
func (Plugin) Handle(_ context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	raw := tCtx.Metadata().Action().Spec.Config["duration"]
	d, err := time.ParseDuration(raw)
	if raw == "" {
		d, err = 0, nil
	}
	if err != nil || d < 0 {
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "InvalidConfig",
			fmt.Sprintf("config.duration %q is not a non-negative duration such as 2s", raw))), nil
	}
	now := tCtx.Metadata().Now()
	var st state
	if _, err := tCtx.PluginStateReader().Get(&st); err != nil {
		return core.Transition{}, err
	}
	if started := startedWithin(st.StartedAt, tCtx.Metadata().Action().CreationTimestamp.Time, now); !started.Equal(st.StartedAt) {
		st.StartedAt = started
		if err := tCtx.PluginStateWriter().Put(stateVersion, st); err != nil {
			return core.Transition{}, err
		}
	}
	if remaining := st.StartedAt.Add(d).Sub(now); remaining > 0 {
		info := core.PhaseInfoRunning(0, "Sleeping")
		info.Message = fmt.Sprintf("sleeping %s, %s left", d, remaining.Round(time.Millisecond))
		info.RequeueAfter = remaining
		return core.DoTransition(info), nil
	}
	if failing := tCtx.Metadata().Action().Spec.Config["failAttempts"]; failing != "" {
		n, err := strconv.Atoi(failing)
		if err != nil || n < 0 {
			return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "InvalidConfig",
				fmt.Sprintf("config.failAttempts %q is not a non-negative number", failing))), nil
		}
		if attempt := tCtx.Metadata().Attempt(); int(attempt) <= n {
			return core.DoTransition(core.PhaseInfoUserFailure("SimulatedFailure",
				fmt.Sprintf("attempt %d fails, as config.failAttempts (%d) asks", attempt, n))), nil
		}
	}
	return core.DoTransition(core.PhaseInfoSuccess("")), nil
}

// Abort implements core.Plugin: there is nothing running to stop.
func (Plugin) Abort(context.Context, core.TaskExecutionContext) error { return nil }

// Finalize implements core.Plugin: there is nothing to release.
func (Plugin) Finalize(context.Context, core.TaskExecutionContext) error { return nil }

// startedWithin is when the sleep started, for one that has not (zero) now. A start
// another executor wrote on its own clock is held to [the action's creation (the API
// server's clock), now]: read as written, a clock an hour ahead would make the sleep an
// hour longer and one an hour behind end it at once.
func startedWithin(started, created, now time.Time) time.Time {
	switch {
	case started.IsZero() || started.After(now):
		return now
	case started.Before(created) && !created.After(now):
		return created
	}
	return started
}
