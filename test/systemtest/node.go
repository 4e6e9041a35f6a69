package systemtest

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
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/test/repo"
)

// Where a test's pods run.
const (
	// NodeStandIn: no node; the stand-in kubelet plays one (Kubelet).
	NodeStandIn = "stand-in"
	// NodeReal: containerd, a real kubelet and kube-scheduler (hack/node.sh attach) join
	// the test's control plane, and the pods are scheduled and run for real.
	NodeReal = "real"
)

// Node is containerd, a kubelet and kube-scheduler started by hack/node.sh for a test's
// API server.
type Node struct {
	dir, script string
	// Name is the node's name in the API server.
	Name string
	// Image is the busybox image the node holds, with sh: the node pulls nothing, so
	// container actions run this one.
	Image string
}

// StartNode starts the node kind names for a system whose files are in dir: NodeReal
// attaches one (AttachNode, in a directory named after dir's, so that each run's
// cgroups are its own); NodeStandIn, or "", none (nil), the pods being the stand-in
// kubelet's.
func StartNode(ctx context.Context, kind string, c client.Client, dir, kubeconfig string, log func(string, ...any)) (*Node, error) {
	switch kind {
	case NodeReal:
		n, err := AttachNode(ctx, c, filepath.Join(dir, filepath.Base(dir)+"-node"), kubeconfig)
		if err != nil {
			return nil, err
		}
		log("node %s Ready, with image %s", n.Name, n.Image)
		return n, nil
	case NodeStandIn, "":
		return nil, nil
	default:
		return nil, fmt.Errorf("system: unknown node %q (want %s or %s)", kind, NodeReal, NodeStandIn)
	}
}

// AttachNode starts a node in dir for the API server kubeconfig reaches, and waits
// until it is Ready. hack/node.sh names the node's cgroups after dir's last element:
// give each run its own, so that runs side by side (or what a killed one left) never
// share them. It needs root.
func AttachNode(ctx context.Context, c client.Client, dir, kubeconfig string) (n *Node, err error) {
	script, err := repo.Path("hack", "node.sh")
	if err != nil {
		return nil, err
	}
	n = &Node{dir: dir, script: script}
	defer func() {
		if err != nil {
			// Stopped here, so that the caller has no node to stop again.
			n.Stop()
			n = nil
		}
	}()
	if n.Name, err = n.run(ctx, "attach", dir, kubeconfig); err != nil {
		return n, err
	}
	if n.Image, err = n.run(ctx, "images"); err != nil {
		return n, err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var node corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err == nil && nodeReady(&node) {
			// The kubelet registers the node tainted not-ready, and the node lifecycle
			// controller, which the tests do not run, would lift the taint once Ready.
			if !untaint(&node) || c.Update(ctx, &node) == nil {
				return n, nil
			}
			// Changed meanwhile: read it again.
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return n, fmt.Errorf("node %s was not Ready within 3 minutes; see %s", n.Name, filepath.Join(dir, "logs", "kubelet.log"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// untaint drops the not-ready taint from n and reports whether it had it.
func untaint(n *corev1.Node) bool {
	kept := n.Spec.Taints[:0]
	for _, t := range n.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady {
			kept = append(kept, t)
		}
	}
	had := len(kept) != len(n.Spec.Taints)
	n.Spec.Taints = kept
	return had
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// run runs hack/node.sh with args and returns the last line it printed.
func (n *Node) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, n.script, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/node.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// Exited names the node's programs that are no longer running: a test stops them only
// with Stop, so any of them gone before is a crash.
func (n *Node) Exited() []string {
	var gone []string
	for _, name := range []string{"containerd", "kubelet", "kube-scheduler"} {
		raw, err := os.ReadFile(filepath.Join(n.dir, "pids", name))
		pid, perr := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || perr != nil || syscall.Kill(pid, 0) != nil {
			gone = append(gone, fmt.Sprintf("the node's %s is not running; see %s", name, filepath.Join(n.dir, "logs", name+".log")))
		}
	}
	return gone
}

// Stop stops the node's containers and programs and removes its mounts and cgroups.
func (n *Node) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.run(ctx, "stop", n.dir); err != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		fmt.Fprintln(os.Stderr, "systemtest:", err)
	}
}
