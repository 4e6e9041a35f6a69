package realnode_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
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
