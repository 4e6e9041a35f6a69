package sandbox_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flytekube/backend/sandbox"
)

// librariesChild names the file a child process (the test binary run again) sends the
// libraries' logs to.
const librariesChild = "FLYTE_SANDBOX_LIBRARIES_CHILD"

// controllerRuntimeGrace is how long after it is loaded controller-runtime waits for a
// logger before it prints a stack (sigs.k8s.io/controller-runtime/pkg/log).
const controllerRuntimeGrace = 30 * time.Second

// librariesChildMain is the child: it does what the sandbox's main does first, waits
// out controller-runtime's grace (its clock, which nothing can move), then logs as
// controller-runtime and client-go do when a watch ends while the sandbox runs.
func librariesChildMain(path string) int {
	loaded := time.Now()
	closeLog, err := sandbox.LogLibrariesTo(path)
	if err != nil {
		_, _ = os.Stderr.WriteString(err.Error())
		return 2
	}
	defer func() { _ = closeLog() }()
	time.Sleep(time.Until(loaded.Add(controllerRuntimeGrace + time.Second)))
	ctrllog.Log.WithName("controller-runtime").Info("a watch ended", "resource", "taskactions")
	klog.Warning("watch of *v1.TaskAction ended with: an error on the server")
	klog.Flush()
	return 0
}

// TestTheLibrariesLogToAFileNotTheTerminal runs the sandbox's logging set-up in a process
// of its own, past controller-runtime's 30 s grace: what controller-runtime and client-go
// log reaches the sandbox's log file, and the terminal gets neither a stack trace nor a
// warning (a first `make run` once opened with controller-runtime's "log.SetLogger(...)
// was never called" and its goroutine stack). It waits in the child, beside the other
// tests.
func TestTheLibrariesLogToAFileNotTheTerminal(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "logs", "libraries.log")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), librariesChild+"="+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the child: %v\n%s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("the terminal got:\n%s", stderr.String())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a watch ended", "watch of *v1.TaskAction ended"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("the log file lacks %q:\n%s", want, raw)
		}
	}
}
