package realnode_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/deploy/imagebuild"
	"github.com/flytekube/backend/test/repo"
)

// TestShippedImageRunsOnTheNode: an image `make images` builds, imported into the node's
// containerd as its tarball, runs as a pod that requires a non-root user (the kubelet
// checks the image's numeric USER) with a read-only root file system, and its program
// starts: the events service prints its flags.
func TestShippedImageRunsOnTheNode(t *testing.T) {
	ctx := context.Background()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	p := imagebuild.Programs[1]
	if p.Name != "events" {
		t.Fatalf("program %s; want events", p.Name)
	}
	img, err := imagebuild.Build(ctx, p, imagebuild.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag("ghcr.io/flytekube/events:realnode-test")
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "events.tar")
	if err := tarball.WriteToFile(archive, ref, img); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "ctr", "--address", filepath.Join(node.Dir, "containerd", "containerd.sock"),
		"-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}

	ns := node.Namespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "events", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:   corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: new(true)},
			Containers: []corev1.Container{{Name: "events", Image: ref.String(), ImagePullPolicy: corev1.PullNever, Args: []string{"-h"},
				SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: new(true), AllowPrivilegeEscalation: new(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		},
	}
	if err := node.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for pod.Status.Phase != corev1.PodSucceeded {
		if pod.Status.Phase == corev1.PodFailed || time.Now().After(deadline) {
			t.Fatalf("pod %s: %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		time.Sleep(200 * time.Millisecond)
		if err := node.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
	}
	logs, err := node.Logs(ctx, pod, "events")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "-database-url") && !strings.Contains(logs, "-listen") {
		t.Fatalf("the events service's usage was not printed: %q", logs)
	}
}
