package chaos

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

// proc is one program of the system, run as its own process and started again after the
// soak kills it. It counts every exit, so that an exit the soak did not cause shows.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string // appended to across restarts

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process has exited
	starts  int
	exits   []exitRecord
	expect  int // exits the soak has announced (kills, outages) and not yet seen
	stopped bool
}

// exitRecord is one exit of a process.
type exitRecord struct {
	At       time.Time
	Err      string
	Expected bool // the soak caused it
}

func newProc(name, bin, logDir string, env []string, args ...string) *proc {
	return &proc{name: name, bin: bin, args: args, env: env, log: filepath.Join(logDir, name+".log")}
}

// start runs the program once more.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.name)
	}
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening the log of %s: %w", p.name, err)
	}
	fmt.Fprintf(logFile, "\n=== chaos: start %d of %s at %s\n", p.starts+1, p.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, and a signal should the soak die, so none outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	p.starts++
	done := p.done
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		p.mu.Lock()
		rec := exitRecord{At: time.Now(), Err: fmt.Sprint(err)}
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

// pid is the running process's id, 0 when none runs.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether the program is up.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// kill sends SIGKILL, as the soak's fault, and waits for the exit.
func (p *proc) kill(timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd == nil {
		p.mu.Unlock()
		return fmt.Errorf("%s is not running", p.name)
	}
	p.expect++
	p.mu.Unlock()
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s: %w", p.name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not exit within %s of SIGKILL", p.name, timeout)
	}
}

// excuse counts an exit the soak caused in another way (an executor losing its lease
// while the soak holds the API server down) as expected.
func (p *proc) excuse(rec *exitRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.exits {
		if p.exits[i].At.Equal(rec.At) {
			p.exits[i].Expected = true
		}
	}
}

// stopOnce stops the program gracefully as a fault (SIGTERM, then SIGKILL after grace);
// it may be started again.
func (p *proc) stopOnce(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd != nil {
		p.expect++
	}
	p.mu.Unlock()
	terminate(cmd, done, grace)
}

// stop ends the program for good (SIGTERM, then SIGKILL after grace).
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	terminate(cmd, done, grace)
}

// exited returns the channel closed when the current process exits (nil when none runs).
func (p *proc) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	return p.done
}

// exitLog returns a copy of the exits so far.
func (p *proc) exitLog() []exitRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]exitRecord(nil), p.exits...)
}

// waitHTTP waits until url answers 200, failing early if the process exits.
func (p *proc) waitHTTP(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
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
		if !p.running() {
			return fmt.Errorf("%s exited before answering %s; see %s", p.name, url, p.log)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer %s within %s; see %s", p.name, url, timeout, p.log)
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
