package realnode_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// dedicated is the taint this test puts on the node, for the duration of the test.
var dedicated = corev1.Taint{Key: "flyte.org/test-dedicated", Value: "research", Effect: corev1.TaintEffectNoSchedule}

// taintNode taints the node until the test ends.
func taintNode(t *testing.T, taint corev1.Taint) {
	t.Helper()
	ctx := context.Background()
	update := func(change func(*corev1.Node)) error {
		var nodes corev1.NodeList
		if err := node.Client.List(ctx, &nodes); err != nil || len(nodes.Items) != 1 {
			t.Fatalf("nodes: %d (%v); want the one", len(nodes.Items), err)
		}
		n := &nodes.Items[0]
		patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
		change(n)
		return node.Client.Patch(ctx, n, patch)
	}
	if err := update(func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, taint) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := update(func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taint.Key })
		}); err != nil {
			t.Errorf("removing the taint: %v", err)
		}
	})
}

// TestPodTemplateWithATolerationAndASidecar: on a node tainted for one team, an action
// whose PodTemplate tolerates the taint runs, with the template's sidecar (one of
// Kubernetes' own, an init container that restarts) writing a file the task reads, and
// the pod ends when the task does; an action without the template waits, unschedulable,
// until the taint goes. The pod carries the action's labels, the task's among them.
func TestPodTemplateWithATolerationAndASidecar(t *testing.T) {
	ctx := context.Background()
	ns := node.Namespace(t)
	image := node.Images[0]
	always := corev1.ContainerRestartPolicyAlways
	shared := []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
	template := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "research", Namespace: ns, Labels: map[string]string{podtemplate.Label: "true"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64(5)),
			Tolerations:                   []corev1.Toleration{{Key: dedicated.Key, Operator: corev1.TolerationOpEqual, Value: dedicated.Value, Effect: dedicated.Effect}},
			Volumes:                       []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{Name: podtemplate.DefaultContainer, Image: image, VolumeMounts: shared,
				Env: []corev1.EnvVar{{Name: "FROM_TEMPLATE", Value: "yes"}}}},
			InitContainers: []corev1.Container{{Name: "sidecar", Image: image, RestartPolicy: &always, VolumeMounts: shared,
				Command: []string{"sh", "-c", `echo sidecar-was-here > /shared/note; trap "exit 0" TERM; while sleep 1; do :; done`}}},
		}},
	}
	if err := node.Client.Create(ctx, template); err != nil {
		t.Fatal(err)
	}
	taintNode(t, dedicated)
	runExecutor(t, ns)

	tolerant := containerAction(ns, "tolerant", 0, `test "$FROM_TEMPLATE" = yes || exit 3
for i in $(seq 50); do test -s /shared/note && break; sleep 0.2; done; grep -q sidecar-was-here /shared/note`)
	tolerant.Spec.PodTemplateName = template.Name
	// An inline fragment without containers keeps the template's. (It may add to the
	// template, not change what it sets, such as its grace period.)
	tolerant.Spec.PodTemplate = &flytev1.PodTemplate{Metadata: flytev1.PodTemplateMetadata{Labels: map[string]string{"cost-center": "research"}},
		Spec: runtime.RawExtension{Raw: []byte(`{"activeDeadlineSeconds": 600}`)}}
	tolerant.Spec.TaskName = "research/models:train"
	plain := containerAction(ns, "plain", 0, "true")
	create(t, tolerant)
	create(t, plain)

	got := waitFinished(t, tolerant)
	if got.Status.Phase != flytev1.PhaseSucceeded || got.Status.Attempts != 1 {
		t.Fatalf("tolerant ended %s after %d attempts (%s, %+v); want Succeeded after 1", got.Status.Phase, got.Status.Attempts, history(got), got.Status.Error)
	}
	var pod corev1.Pod
	if err := node.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tolerant-1"}, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Labels["cost-center"] != "research" || pod.Labels[core.LabelTask] != "research_models_train" || pod.Labels[core.LabelAction] != "tolerant" || pod.Labels[core.LabelRun] != "real" {
		t.Errorf("pod labels %v; want the action's identity and its task's name", pod.Labels)
	}
	if len(pod.Status.InitContainerStatuses) != 1 || pod.Status.InitContainerStatuses[0].State.Terminated == nil {
		t.Errorf("sidecar status %+v; want it stopped with the task", pod.Status.InitContainerStatuses)
	}

	waiting := waitPhase(t, plain, flytev1.PhaseWaitingForResources)
	if c := meta.FindStatusCondition(waiting.Status.Conditions, flytev1.ConditionProgressing); c == nil || c.Reason != "Unschedulable" || !strings.Contains(c.Message, "untolerated taint") {
		t.Errorf("plain: condition %+v; want it unschedulable for the taint", c)
	}
}

// TestInlinePodTemplateCannotTakeOverAPrivilegedInitContainer: a platform's template
// whose privileged init container writes to a host directory (as GPU driver set-up
// does) runs as the platform wrote it under a fragment that only adds; a fragment that
// gives that init container its own command, or mounts the host directory in the
// task's container, fails with PodTemplateRefused, and nothing of it reaches the host.
func TestInlinePodTemplateCannotTakeOverAPrivilegedInitContainer(t *testing.T) {
	ns := node.Namespace(t)
	image := node.Images[0]
	host := t.TempDir()
	hostDir := corev1.HostPathDirectory
	template := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-driver", Namespace: ns, Labels: map[string]string{podtemplate.Label: "true"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "driver", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: host, Type: &hostDir}}}},
			InitContainers: []corev1.Container{{Name: "driver-setup", Image: image, Command: []string{"sh", "-c", "echo set-up > /host/driver"},
				SecurityContext: &corev1.SecurityContext{Privileged: new(true)}, VolumeMounts: []corev1.VolumeMount{{Name: "driver", MountPath: "/host"}}}},
			Containers: []corev1.Container{{Name: podtemplate.DefaultContainer, Image: image}},
		}},
	}
	if err := node.Client.Create(context.Background(), template); err != nil {
		t.Fatal(err)
	}
	runExecutor(t, ns)

	withFragment := func(name, command, fragment string) *flytev1.TaskAction {
		a := containerAction(ns, name, 0, command)
		a.Spec.PodTemplateName = template.Name
		a.Spec.PodTemplate = &flytev1.PodTemplate{Spec: runtime.RawExtension{Raw: []byte(fragment)}}
		return a
	}
	takeover := withFragment("takeover", "true", `{"initContainers":[{"name":"driver-setup","command":["sh","-c","echo taken > /host/taken"]}]}`)
	hostMount := withFragment("host-mount", "echo taken > /host/taken",
		`{"containers":[{"name":"task","volumeMounts":[{"name":"driver","mountPath":"/host"}]}]}`)
	benign := withFragment("benign", `test "$MODE" = fast && echo ok > /scratch/ok && test -s /scratch/ok`,
		`{"volumes":[{"name":"scratch","emptyDir":{}}],"containers":[{"name":"task","env":[{"name":"MODE","value":"fast"}],"volumeMounts":[{"name":"scratch","mountPath":"/scratch"}]}]}`)
	for _, a := range []*flytev1.TaskAction{takeover, hostMount, benign} {
		create(t, a)
	}

	if got := waitFinished(t, benign); got.Status.Phase != flytev1.PhaseSucceeded {
		t.Fatalf("benign ended %s (%s, %+v); want Succeeded", got.Status.Phase, history(got), got.Status.Error)
	}
	if out, err := os.ReadFile(filepath.Join(host, "driver")); err != nil || strings.TrimSpace(string(out)) != "set-up" {
		t.Errorf("the template's init container wrote %q (%v); want it to have run as the platform wrote it", out, err)
	}
	for _, a := range []*flytev1.TaskAction{takeover, hostMount} {
		got := waitFinished(t, a)
		if e := got.Status.Error; got.Status.Phase != flytev1.PhaseFailed || e == nil || e.Code != podtemplate.CodeRefused {
			t.Errorf("%s ended %s (%+v); want Failed with %s", a.Name, got.Status.Phase, e, podtemplate.CodeRefused)
		}
		var pods corev1.PodList
		if err := node.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{core.LabelAction: a.Name}); err != nil || len(pods.Items) > 0 {
			t.Errorf("%s: %d pods (%v); want none", a.Name, len(pods.Items), err)
		}
	}
	if _, err := os.Stat(filepath.Join(host, "taken")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a fragment wrote on the host (%v)", err)
	}
}

// TestTemplatePlaceholderImageDoesNotMakeTheTaskPull: a namespace's default template
// whose "default" container names an untagged placeholder image, as Flyte's docs show,
// is stored by the API server with imagePullPolicy Always; the task's own image, tagged
// and present on the node (which can pull nothing), runs to success with the template's
// environment, its container pulling only if not present.
func TestTemplatePlaceholderImageDoesNotMakeTheTaskPull(t *testing.T) {
	ctx := context.Background()
	ns := node.Namespace(t)
	template := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "placeholder", Namespace: ns, Labels: map[string]string{podtemplate.Label: "true"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: podtemplate.DefaultContainer,
			Image: "docker.io/rwgrim/docker-noop", Env: []corev1.EnvVar{{Name: "FROM_TEMPLATE", Value: "yes"}}}}}},
	}
	if err := node.Client.Create(ctx, template); err != nil {
		t.Fatal(err)
	}
	if c := template.Template.Spec.Containers[0]; c.ImagePullPolicy != corev1.PullAlways {
		t.Fatalf("the API server stored the placeholder with imagePullPolicy %q; the test needs its default, Always", c.ImagePullPolicy)
	}
	// A pull that fails fails the action soon, rather than leaving it in Initializing
	// for the default grace period.
	runExecutor(t, ns, func(c *config.Config) {
		c.K8s.DefaultPodTemplateName = template.Name
		c.K8s.ImagePullGracePeriod = metav1.Duration{Duration: 10 * time.Second}
	})
	ta := containerAction(ns, "local-image", 0, `test "$FROM_TEMPLATE" = yes`)
	create(t, ta)

	got := waitFinished(t, ta)
	if got.Status.Phase != flytev1.PhaseSucceeded {
		t.Fatalf("ended %s (%s, %+v); want Succeeded: the task's image %s is on the node, which can pull nothing",
			got.Status.Phase, history(got), got.Status.Error, ta.Spec.Container.Image)
	}
	var pod corev1.Pod
	if err := node.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "local-image-1"}, &pod); err != nil {
		t.Fatal(err)
	}
	if c := pod.Spec.Containers[0]; c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("the task's container has imagePullPolicy %q; want IfNotPresent, the default for its tagged image", c.ImagePullPolicy)
	}
}
