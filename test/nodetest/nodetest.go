// Package nodetest gives tests a real single-node Kubernetes: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd and kubelet on loopback, started by
// hack/node.sh (which builds and installs what it needs), one per test package. Pods run
// for real; their logs are read from the node's files, never through the API server.
package nodetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
)

// Options shape the node.
type Options struct {
	// CRDDirectoryPaths are installed before tests start.
	CRDDirectoryPaths []string
	// Scheme knows every type the tests use; client-go's built-in types when nil.
	Scheme *runtime.Scheme
}

// Node is a running node and its control plane.
type Node struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a direct (uncached) client.
	Client client.Client
	// Scheme is the scheme Client uses.
	Scheme *runtime.Scheme
	// Images are the task images the node holds; the first is a busybox with sh.
	Images []string
	// Dir holds the node's state, its logs under Dir/logs.
	Dir string

	lock *os.File // the machine's node lock, held while the node runs
}

// Unavailable says why this machine cannot run a node, or "" when it can: the node needs
// root (containerd, kubelet, cgroups).
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "a real node needs root"
	}
	return ""
}

// script runs hack/node.sh with args and returns its last line of output.
func script(args ...string) (string, error) {
	path, err := repo.Path("hack", "node.sh")
	if err != nil {
		return "", err
	}
	cmd := exec.Command(path, args...)
	cmd.Stderr = os.Stderr // a first build takes minutes; show its progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("nodetest: hack/node.sh %s: %w", strings.Join(args, " "), err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// Files in a node's directory that say whose it is and whether it was stopped.
const (
	ownerFile   = "owner"
	stoppedFile = "stopped"
	// lockFile, in the temporary directory, is locked by the process whose node runs.
	lockFile = "flyte-node.lock"
)

// Start starts a node in a new directory and installs the CRDs. The machine holds one
// node at a time (test packages run side by side, and each wants its node's timing to be
// its own): Start waits for the machine's node lock, which the kernel releases when
// its holder exits however it exits. A node left running by a process that died (a test
// binary that panicked or timed out) is then stopped first.
func Start(opts Options) (n *Node, err error) {
	lock, err := lockMachine(filepath.Join(os.TempDir(), lockFile))
	if err != nil {
		return nil, err
	}
	defer func() {
		if n == nil {
			_ = lock.Close()
		}
	}()
	if err := stopOrphans(os.TempDir()); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "flyte-node-")
	if err != nil {
		return nil, err
	}
	n = &Node{Dir: dir, lock: lock}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		_ = n.Stop()
		return nil, fmt.Errorf("nodetest: %w", err)
	}
	defer func() {
		if err != nil {
			_ = n.Stop()
		}
	}()
	kubeconfig, err := script("start", dir)
	if err != nil {
		return n, err
	}
	if n.Config, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return n, fmt.Errorf("nodetest: reading %s: %w", kubeconfig, err)
	}
	n.Config.QPS, n.Config.Burst = 100, 200
	n.Scheme = opts.Scheme
	if n.Scheme == nil {
		n.Scheme = clientgoscheme.Scheme
	}
	if n.Client, err = client.New(n.Config, client.Options{Scheme: n.Scheme}); err != nil {
		return n, fmt.Errorf("nodetest: creating client: %w", err)
	}
	if len(opts.CRDDirectoryPaths) > 0 {
		if _, err := envtest.InstallCRDs(n.Config, envtest.CRDInstallOptions{Paths: opts.CRDDirectoryPaths, ErrorIfPathMissing: true}); err != nil {
			return n, fmt.Errorf("nodetest: installing CRDs: %w", err)
		}
	}
	images, err := script("images")
	if err != nil {
		return n, err
	}
	n.Images = strings.Fields(images)
	return n, nil
}

// Stop stops the node, removes its directory and lets the next node start.
func (n *Node) Stop() error {
	if err := stop(n.Dir); err != nil {
		return err
	}
	err := os.RemoveAll(n.Dir)
	n.unlock()
	return err
}

// unlock releases the machine's node lock; the node must be stopped.
func (n *Node) unlock() {
	if n.lock != nil {
		_ = n.lock.Close()
		n.lock = nil
	}
}

// lockMachine takes the exclusive lock on the file at path, waiting for its holder (and
// saying so when it has to), and returns the open file that holds it.
func lockMachine(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nodetest: opening the node lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		fmt.Fprintf(os.Stderr, "nodetest: waiting for another test package's node to stop (%s)\n", path)
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("nodetest: taking the node lock %s: %w", path, err)
	}
	return f, nil
}

// stop stops the node in dir and marks it stopped, keeping its files.
func stop(dir string) error {
	if _, err := script("stop", dir); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, stoppedFile), nil, 0o644)
}

// stopOrphans stops the nodes under tmp whose owner has died without stopping them. Their
// directories stay, with the logs a failed run pointed at.
func stopOrphans(tmp string) error {
	dirs, err := filepath.Glob(filepath.Join(tmp, "flyte-node-*"))
	if err != nil {
		return fmt.Errorf("nodetest: %w", err)
	}
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not started by nodetest, or being set up
		}
		if _, err := os.Stat(filepath.Join(dir, stoppedFile)); err == nil {
			continue
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			continue
		}
		if alive(owner) {
			return fmt.Errorf("nodetest: a node already runs in %s for process %d; the machine holds one node at a time", dir, owner)
		}
		fmt.Fprintf(os.Stderr, "nodetest: stopping the node in %s, left running by process %d, which has died\n", dir, owner)
		if err := stop(dir); err != nil {
			return err
		}
	}
	return nil
}

// alive reports whether process pid exists (EPERM: it does, as another user's).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Main runs a test package's tests against a node started for them; call it from
// TestMain and exit with its result. Without root the tests are skipped, and it says so.
func Main(m *testing.M, node **Node, opts Options) int {
	if why := Unavailable(); why != "" {
		fmt.Fprintf(os.Stderr, "nodetest: skipping the real-node tests: %s\n", why)
		return 0
	}
	n, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*node = n
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "nodetest: the node's logs are in %s/logs (kept)\n", n.Dir)
		_ = stop(n.Dir)
		n.unlock()
		return code
	}
	if err := n.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "nodetest: stopping the node:", err)
	}
	return code
}

// Namespace creates a namespace for one test and deletes it when the test ends.
func (n *Node) Namespace(t testing.TB) string {
	t.Helper()
	return kubetest.Namespace(t, n.Client)
}

// Logs returns what a pod's container wrote, from the node's log files (the kubelet's
// CRI format: time, stream, tag, text), text only.
func (n *Node) Logs(ctx context.Context, pod *corev1.Pod, container string) (string, error) {
	dir := filepath.Join(n.Dir, "kubelet", "pod-logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("nodetest: no logs of %s/%s in %s", pod.Name, container, dir)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		for _, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
			if parts := strings.SplitN(line, " ", 4); len(parts) == 4 {
				b.WriteString(parts[3])
				b.WriteString("\n")
			}
		}
	}
	return b.String(), ctx.Err()
}
