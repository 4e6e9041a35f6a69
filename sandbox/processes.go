package sandbox

import (
	"fmt"
	"syscall"
	"time"

	"github.com/flytekube/backend/test/process"
)

// stopGrace is how long a program has to shut down once asked to.
const stopGrace = 15 * time.Second

// startProcess runs bin with args and extra environment as its own process, logging to
// dir/<name>.log; stop stops it.
func startProcess(name, bin, dir string, env []string, args ...string) (*process.Process, error) {
	p := process.New(name, bin, dir, env, args...)
	return p, start(p)
}

// start runs p as the sandbox runs its programs: a log of this run alone, and SIGTERM
// should the sandbox die, so that none outlives it and each shuts down as it would when
// asked.
func start(p *process.Process) error {
	p.FreshLog, p.DeathSignal = true, syscall.SIGTERM
	if err := p.Start(); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	return nil
}

// stopFunc is how the sandbox ends p: asked to shut down, and killed if it has not within
// stopGrace.
func stopFunc(p *process.Process) func() { return func() { p.Stop(stopGrace) } }
