package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// process is one of the system's programs, run as its own process with its log in a file.
type process struct {
	name string
	log  string
	done chan error
	// stopping asks the program to shut down (SIGTERM), and kills it if it has not
	// within the command's WaitDelay.
	stopping context.CancelFunc
}

// stopGrace is how long a program has to shut down once asked to.
var stopGrace = 15 * time.Second

// startProcess runs bin with args and extra environment, logging to dir/<name>.log.
func startProcess(name, bin, dir string, env []string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %s: %w", name, err)
	}
	// Not the sandbox's context: Ctrl-C ends that, and the programs are stopped in order.
	ctx, stopping := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace // then SIGKILL
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so that Ctrl-C reaches only the sandbox, which stops the
	// programs in order; and a signal when the sandbox dies, so none outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		stopping()
		_ = logFile.Close()
		return nil, fmt.Errorf("sandbox: starting %s: %w", name, err)
	}
	p := &process{name: name, log: logPath, done: make(chan error, 1), stopping: stopping}
	go func() {
		p.done <- cmd.Wait()
		_ = logFile.Close()
	}()
	return p, nil
}

// stop asks the process to shut down gracefully, kills it if it does not in time, and
// waits for it to be gone.
func (p *process) stop() {
	p.stopping()
	err := <-p.done
	p.done <- err // for whoever asks next
}

// waitHTTP waits until url answers 200 to client, or the process exits, or ctx ends.
func (p *process) waitHTTP(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
	return p.waitFor(ctx, timeout, "answer "+url, func(ctx context.Context) bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// waitFor waits until ready says the process is ready (what names it in the error), or
// the process exits, or ctx ends.
func (p *process) waitFor(ctx context.Context, timeout time.Duration, what string, ready func(context.Context) bool) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-p.done:
			p.done <- err // for stop
			return false, fmt.Errorf("sandbox: %s exited (%v); see %s", p.name, err, p.log)
		default:
		}
		return ready(ctx), nil
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		return fmt.Errorf("sandbox: %s did not %s within %s; see %s", p.name, what, timeout, p.log)
	}
	return err
}
