package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one of the system's programs, run as its own process with its log in a file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan error
}

// startProcess runs bin with args and extra environment, logging to dir/<name>.log.
func startProcess(name, bin, dir string, env []string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so that Ctrl-C reaches only the sandbox, which stops the
	// programs in order; and a signal when the sandbox dies, so none outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("sandbox: starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() {
		p.done <- cmd.Wait()
		_ = logFile.Close()
	}()
	return p, nil
}

// stop asks the process to shut down gracefully and kills it if it does not in time.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitHTTP waits until url answers 200 to client, or the process exits, or ctx ends.
func (p *process) waitHTTP(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
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
		select {
		case err := <-p.done:
			p.done <- err // for stop
			return fmt.Errorf("sandbox: %s exited (%v); see %s", p.name, err, p.log)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("sandbox: %s did not answer %s within %s; see %s", p.name, url, timeout, p.log)
			}
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
