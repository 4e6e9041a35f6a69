package systemtest

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

// Proc is one program of the system, run as its own process and started again after a
// test stops or kills it. It counts every exit, so that an exit the test did not cause
// shows.
type Proc struct {
	Name string
	bin  string
	args []string
	env  []string
	Log  string // appended to across restarts

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process has exited
	starts  int
	exits   []ExitRecord
	expect  int // exits the test has announced (kills, outages) and not yet seen
	stopped bool
}

// ExitRecord is one exit of a process.
type ExitRecord struct {
	At       time.Time
	Err      string
	Expected bool // the test caused it
}

// NewProc is the program bin, run with args and env added to the test's environment,
// logging to logDir/name.log; Start runs it.
func NewProc(name, bin, logDir string, env []string, args ...string) *Proc {
	return &Proc{Name: name, bin: bin, args: args, env: env, Log: filepath.Join(logDir, name+".log")}
}

// Start runs the program once more.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.Name)
	}
	logFile, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening the log of %s: %w", p.Name, err)
	}
	fmt.Fprintf(logFile, "\n=== start %d of %s at %s\n", p.starts+1, p.Name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, and a signal should the test die, so none outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
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
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the program is up.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Kill sends SIGKILL, as a fault, and waits for the exit.
func (p *Proc) Kill(timeout time.Duration) error {
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

// Excuse counts an exit the test caused in another way (an executor losing its lease
// while the test holds the API server down) as expected.
func (p *Proc) Excuse(rec *ExitRecord) {
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
func (p *Proc) StopOnce(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd != nil {
		p.expect++
	}
	p.mu.Unlock()
	terminate(cmd, done, grace)
}

// Stop ends the program for good (SIGTERM, then SIGKILL after grace).
func (p *Proc) Stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	terminate(cmd, done, grace)
}

// Exited returns the channel closed when the current process exits (nil when none runs).
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	return p.done
}

// ExitLog returns a copy of the exits so far.
func (p *Proc) ExitLog() []ExitRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ExitRecord(nil), p.exits...)
}

// WaitHTTP waits until url answers 200, failing early if the process exits.
func (p *Proc) WaitHTTP(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !p.Running() {
			return fmt.Errorf("%s exited before answering %s; see %s", p.Name, url, p.Log)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer %s within %s; see %s", p.Name, url, timeout, p.Log)
		case <-time.After(200 * time.Millisecond):
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
