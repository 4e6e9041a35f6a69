package executor_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// podTemplate is a PodTemplate the executor may use (labelled for it) unless unlabelled.
func podTemplate(ns, name string, labelled bool, spec corev1.PodSpec) *corev1.PodTemplate {
	t := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": name}}, Spec: spec}}
	if labelled {
		t.Labels = map[string]string{podtemplate.Label: "true"}
	}
	return t
}

func tolerating(key string) []corev1.Toleration {
	return []corev1.Toleration{{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
}

// placeholder is the container a template applies to the task's, by the name "default".
func placeholder(env ...corev1.EnvVar) corev1.Container {
	return corev1.Container{Name: podtemplate.DefaultContainer, Image: "registry.k8s.io/pause:3.10", Env: env}
}

// tolerationKeys lists the keys of a pod's tolerations but those the API server's
// DefaultTolerationSeconds admission adds to every pod.
func tolerationKeys(pod *corev1.Pod) string {
	var keys []string
	for _, tol := range pod.Spec.Tolerations {
		if !strings.HasPrefix(tol.Key, "node.kubernetes.io/") {
			keys = append(keys, tol.Key)
		}
	}
	return strings.Join(keys, ",")
}

// TestPodTemplatesShapeTaskPods: the cluster's default template, one an action names
// (from its namespace, else the executor's), and an action's inline fragment, merged as
// documented; a name that is not there, or not labelled for tasks, fails the action with
// PodTemplateNotFound, one adding a second container (which would keep the pod running
// after the task) with BadPodTemplate, and a fragment asking for the host's network with
// PodTemplateRefused.
func TestPodTemplatesShapeTaskPods(t *testing.T) {
	ctx := context.Background()
	ns, home := env.Namespace(t), env.Namespace(t)
	for _, tpl := range []*corev1.PodTemplate{
		podTemplate(ns, "cluster-default", true, corev1.PodSpec{Tolerations: tolerating("default"),
			Containers: []corev1.Container{placeholder(corev1.EnvVar{Name: "FROM", Value: "default"})}}),
		podTemplate(home, "gpu", true, corev1.PodSpec{Tolerations: tolerating("gpu"), NodeSelector: map[string]string{"pool": "gpu"},
			Containers:     []corev1.Container{placeholder(corev1.EnvVar{Name: "FROM", Value: "gpu"})},
			InitContainers: []corev1.Container{{Name: "sidecar", Image: "registry.k8s.io/pause:3.10", RestartPolicy: new(corev1.ContainerRestartPolicyAlways)}}}),
		podTemplate(ns, "two-containers", true, corev1.PodSpec{Containers: []corev1.Container{placeholder(), {Name: "proxy", Image: "registry.k8s.io/pause:3.10"}}}),
		podTemplate(ns, "unlabelled", false, corev1.PodSpec{Containers: []corev1.Container{placeholder()}}),
	} {
		create(t, tpl)
	}
	cfg := testConfig()
	cfg.K8s.DefaultPodTemplateName, cfg.ExecutorNamespace = "cluster-default", home
	run(t, cfg, ns, nil)

	plain := containerAction(ns, "plain", 0)
	named := containerAction(ns, "named", 0)
	named.Spec.PodTemplateName = "gpu"
	named.Spec.PodTemplate = &flytev1.PodTemplate{
		Metadata: flytev1.PodTemplateMetadata{Labels: map[string]string{"inline": "yes"}},
		Spec:     runtime.RawExtension{Raw: []byte(`{"tolerations":[{"key":"inline","operator":"Exists"}],"containers":[{"name":"task","env":[{"name":"INLINE","value":"1"}]}]}`)},
	}
	named.Spec.TaskName = "demo/tasks:train"
	missing := containerAction(ns, "missing", 2)
	missing.Spec.PodTemplateName = "nowhere"
	unlabelled := containerAction(ns, "unlabelled", 2)
	unlabelled.Spec.PodTemplateName = "unlabelled"
	asJob := jobAction(ns, "job", 0)
	asJob.Spec.PodTemplateName = "gpu"
	twoContainers := containerAction(ns, "two-containers", 2)
	twoContainers.Spec.PodTemplateName = "two-containers"
	host := containerAction(ns, "host", 2)
	host.Spec.PodTemplate = &flytev1.PodTemplate{Spec: runtime.RawExtension{Raw: []byte(`{"hostNetwork":true}`)}}
	for _, a := range []*flytev1.TaskAction{plain, named, asJob, missing, unlabelled, twoContainers, host} {
		create(t, a)
	}

	envOf := func(c *corev1.Container) map[string]string {
		out := map[string]string{}
		for _, e := range c.Env {
			out[e.Name] = e.Value
		}
		return out
	}
	pod := waitPod(t, ns, "plain-1")
	if c := pod.Spec.Containers[0]; c.Name != flytek8s.ContainerName || envOf(&c)["FROM"] != "default" || c.Image != "busybox:1.36" {
		t.Errorf("plain: container %+v; want the task's, with the default template's env", c)
	}
	if keys := tolerationKeys(pod); keys != "default" || pod.Labels["team"] != "cluster-default" {
		t.Errorf("plain: tolerations %s, labels %v; want the default template's", keys, pod.Labels)
	}

	pod = waitPod(t, ns, "named-1")
	c := pod.Spec.Containers[0]
	if got := envOf(&c); c.Name != flytek8s.ContainerName || got["FROM"] != "gpu" || got["INLINE"] != "1" || got[flytek8s.EnvAttempt] != "1" {
		t.Errorf("named: task container %+v; want the named template's env, the inline fragment's and the executor's", c)
	}
	keys := tolerationKeys(pod)
	if keys != "gpu,inline" || pod.Spec.NodeSelector["pool"] != "gpu" || len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 1 {
		t.Errorf("named: tolerations %v, node selector %v, %d containers and %d init containers; want gpu and inline (not the default's), the pool, a sidecar",
			keys, pod.Spec.NodeSelector, len(pod.Spec.Containers), len(pod.Spec.InitContainers))
	}
	want := map[string]string{"team": "gpu", "inline": "yes", core.LabelTask: "demo_tasks_train", core.LabelRun: "r1",
		core.LabelAction: "named", core.LabelAttempt: "1", core.LabelProject: "demo", core.LabelDomain: "development"}
	for k, v := range want {
		if pod.Labels[k] != v {
			t.Errorf("named: label %s = %q; want %q (labels %v)", k, pod.Labels[k], v, pod.Labels)
		}
	}

	// A Job's pods get what a pod gets.
	job := waitJob(t, ns, "job-1")
	pt := job.Spec.Template
	if keys := tolerationKeys(&corev1.Pod{Spec: pt.Spec}); keys != "gpu" || len(pt.Spec.InitContainers) != 1 || pt.Labels["team"] != "gpu" ||
		pt.Labels[core.LabelAction] != "job" || envOf(&pt.Spec.Containers[0])["FROM"] != "gpu" {
		t.Errorf("job: pod template %+v; want the named template's toleration, sidecar, label and env with the action's labels", pt)
	}

	for _, tt := range []struct {
		action *flytev1.TaskAction
		code   string
		says   string
	}{
		{missing, podtemplate.CodeNotFound, `"nowhere"`},
		{unlabelled, podtemplate.CodeNotFound, podtemplate.Label},
		{twoContainers, podtemplate.CodeInvalid, "initContainers"},
		{host, podtemplate.CodeRefused, "host namespaces"},
	} {
		ta := waitFailed(t, client.ObjectKeyFromObject(tt.action))
		if e := ta.Status.Error; e == nil || e.Code != tt.code || e.Kind != flytev1.ErrorKindUser || ta.Status.Attempts != 1 || !strings.Contains(e.Message, tt.says) {
			t.Errorf("%s: status %+v; want one attempt failed for good with %s saying %s", tt.action.Name, ta.Status, tt.code, tt.says)
		}
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{core.LabelAction: tt.action.Name}); err != nil || len(pods.Items) > 0 {
			t.Errorf("%s: %d pods (%v); want none", tt.action.Name, len(pods.Items), err)
		}
	}
}
