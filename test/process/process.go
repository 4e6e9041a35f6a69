// Package process supervises a program run as a process of its own, for whatever runs
// the system's programs outside a test's process: make run (sandbox), the chaos soak and
// the upgrade test (through test/systemtest), a previous release's events service
// (test/eventsrelease). A Process logs to a file, is stopped gracefully (SIGTERM to its
// process group, SIGKILL after a grace), may be killed as a fault and started again, and
// counts every exit, so that an exit no one caused shows.
package process

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Process is one program, run as its own process and started again after it stops or
// is killed.
type Process struct {
	Name string
	// Log is the file its output goes to, appended to across starts: logDir/Name.log
	// unless set otherwise before the first Start.
	Log string
	// FreshLog empties Log at the first start instead of appending to what an earlier
	// run left there (the sandbox's logs are of its run alone).
	FreshLog bool
	// DeathSignal is what the process gets should the one that started it die, so that
	// none outlives it: SIGKILL unless set before Start (SIGTERM lets it shut down).
	DeathSignal syscall.Signal

	bin  string
	args []string
	env  []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process has exited
	starts  int
	exits   []ExitRecord
	expect  int // exits the caller has announced (kills, outages) and not yet seen
	stopped bool
}

// ExitRecord is one exit of a process.
type ExitRecord struct {
	At       time.Time
	Err      string
	Expected bool // the caller caused it
}

// New is the program bin, run with args and env added to this process's environment,
// logging to logDir/name.log; Start runs it.
func New(name, bin, logDir string, env []string, args ...string) *Process {
	return &Process{Name: name, bin: bin, args: args, env: env, Log: filepath.Join(logDir, name+".log")}
}

// Start runs the program once more. A start that does not begin the log is marked in it
// by a line of its own.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.Name)
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if p.FreshLog && p.starts == 0 {
		flags |= os.O_TRUNC
	}
	logFile, err := os.OpenFile(p.Log, flags, 0o644)
	if err != nil {
		return fmt.Errorf("opening the log of %s: %w", p.Name, err)
	}
	if info, err := logFile.Stat(); err == nil && info.Size() > 0 {
		fmt.Fprintf(logFile, "\n=== start %d of %s at %s\n", p.starts+1, p.Name, time.Now().Format(time.RFC3339Nano))
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	death := p.DeathSignal
	if death == 0 {
		death = syscall.SIGKILL
	}
	// Its own process group, so that a terminal's Ctrl-C reaches only the caller, which
	// stops its programs in order, and so that a stop or a kill reaches what the program
	// started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: death}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	p.starts++
	done := p.done
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		p.mu.Lock()
		rec := ExitRecord{At: time.Now(), Err: fmt.Sprint(err)}
		if p.expect > 0 || p.stopped {
			rec.Expected = true
			if p.expect > 0 {
				p.expect--
			}
		}
		p.exits = append(p.exits, rec)
		p.cmd = nil
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Pid is the running process's id, 0 when none runs.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the program is up.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Kill sends SIGKILL, as a fault, and waits for the exit.
func (p *Process) Kill(timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd == nil {
		p.mu.Unlock()
		return fmt.Errorf("%s is not running", p.Name)
	}
	p.expect++
	p.mu.Unlock()
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s: %w", p.Name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %s of SIGKILL", p.Name, timeout)
	}
}

// Excuse counts an exit the caller caused in another way (an executor losing its lease
// while the test holds the API server down) as expected.
func (p *Process) Excuse(rec *ExitRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.exits {
		if p.exits[i].At.Equal(rec.At) {
			p.exits[i].Expected = true
		}
	}
}

// StopOnce stops the program gracefully as a fault (SIGTERM, then SIGKILL after grace);
// it may be started again.
func (p *Process) StopOnce(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd != nil {
		p.expect++
	}
	p.mu.Unlock()
	terminate(cmd, done, grace)
}

// Stop ends the program for good (SIGTERM, then SIGKILL after grace) and waits for it to
// be gone; it does nothing when the program is not running, so it may be called twice.
func (p *Process) Stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	terminate(cmd, done, grace)
}

// Exited returns the channel closed when the current process exits (nil when none runs).
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	return p.done
}

// ExitLog returns a copy of the exits so far.
func (p *Process) ExitLog() []ExitRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ExitRecord(nil), p.exits...)
}

// WaitHTTP waits until url answers 200 to client, failing early if the process exits.
func (p *Process) WaitHTTP(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
	return p.WaitFor(ctx, timeout, "answer "+url, func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// pollInterval is how often WaitFor asks.
const pollInterval = 100 * time.Millisecond

// WaitFor waits until ready says the program is ready (what names that in the error),
// failing early if the process exits or ctx ends.
func (p *Process) WaitFor(ctx context.Context, timeout time.Duration, what string, ready func(context.Context) bool) error {
	exited := p.Exited()
	if exited == nil {
		// It may have exited before the wait began (a program that fails at once, on a
		// loaded machine): say how, as a wait that saw the exit would.
		if exits := p.ExitLog(); len(exits) > 0 {
			return fmt.Errorf("%s exited (%s) before it could %s; see %s", p.Name, exits[len(exits)-1].Err, what, p.Log)
		}
		return fmt.Errorf("%s is not running; see %s", p.Name, p.Log)
	}
	// ready is asked within the deadline too, so that a request that hangs ends with it.
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if ready(waitCtx) {
			return nil
		}
		select {
		case <-exited:
			exits := p.ExitLog()
			return fmt.Errorf("%s exited (%s) before it could %s; see %s", p.Name, exits[len(exits)-1].Err, what, p.Log)
		case <-waitCtx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for %s to %s: %w", p.Name, what, ctx.Err())
			}
			return fmt.Errorf("%s did not %s within %s; see %s", p.Name, what, timeout, p.Log)
		case <-time.After(pollInterval):
		}
	}
}

// terminate asks cmd's process group to end (SIGTERM), kills it after grace, and waits
// for done; a nil cmd is not running.
func terminate(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}
