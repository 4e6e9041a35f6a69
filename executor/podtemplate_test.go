package executor_test

import (
	"context"
	"os"
	"path/filepath"
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
// documented (the fragment's tolerations too, once k8s.inlinePodTemplateFields lists
// them); a name that is not there, or not labelled for tasks, fails the action with
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
	// Tolerations are the platform's unless it lets fragments set them too.
	cfg.K8s.InlinePodTemplateFields = append(cfg.K8s.InlinePodTemplateFields, "tolerations")
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

// TestInlinePodTemplatesCannotTakeOver: beside a platform's labelled template with a
// privileged init container and a hostPath volume (as GPU driver set-up templates
// have), with the staged file storage mounted and a Secret of spec.secrets, an action's
// fragment that takes over the init container by name, mounts the template's hostPath
// volume or the executor's staged inputs (writable or not), defines a volume of the
// executor's name, picks a node, tolerates every taint, claims a system priority or
// another ServiceAccount, or references a Secret fails for good with
// PodTemplateRefused, and no pod is created; a fragment that only adds still runs.
func TestInlinePodTemplatesCannotTakeOver(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "inputs.json"), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	hostDir := corev1.HostPathDirectory
	create(t, podTemplate(ns, "gpu-driver", true, corev1.PodSpec{
		Volumes: []corev1.Volume{{Name: "nvidia-driver", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/nvidia", Type: &hostDir}}}},
		InitContainers: []corev1.Container{{Name: "driver-setup", Image: "registry.k8s.io/pause:3.10", Command: []string{"/pause"},
			SecurityContext: &corev1.SecurityContext{Privileged: new(true)},
			VolumeMounts:    []corev1.VolumeMount{{Name: "nvidia-driver", MountPath: "/run/nvidia"}}}},
		Containers: []corev1.Container{placeholder(corev1.EnvVar{Name: "FROM", Value: "gpu-driver"})},
	}))
	cfg := testConfig()
	cfg.Storage.AllowedPrefixes, cfg.K8s.MountFileStorage = []string{"file://" + dir}, true
	run(t, cfg, ns, nil)

	action := func(name, fragment string) *flytev1.TaskAction {
		a := containerAction(ns, name, 2)
		a.Spec.InputURI, a.Spec.RunOutputBase = "file://"+dir+"/inputs.json", "file://"+dir+"/out"
		a.Spec.Secrets = []flytev1.TaskSecret{{Name: "db", MountPath: "/etc/db"}}
		a.Spec.PodTemplateName = "gpu-driver"
		a.Spec.PodTemplate = &flytev1.PodTemplate{Spec: runtime.RawExtension{Raw: []byte(fragment)}}
		return a
	}
	refused := []struct {
		action *flytev1.TaskAction
		says   string
	}{
		{action("takeover", `{"initContainers":[{"name":"driver-setup","image":"busybox:1.36","command":["sh","-c","cat /dev/mem"]}]}`), `"driver-setup"`},
		{action("host-mount", `{"containers":[{"name":"task","volumeMounts":[{"name":"nvidia-driver","mountPath":"/host"}]}]}`), `"nvidia-driver"`},
		{action("inputs-writable", `{"containers":[{"name":"task","volumeMounts":[{"name":"flyte-inputs","mountPath":"/rw"}]}]}`), `"flyte-inputs"`},
		{action("inputs-read-only", `{"containers":[{"name":"task","volumeMounts":[{"name":"flyte-inputs","mountPath":"/ro","readOnly":true}]}]}`), `"flyte-inputs"`},
		{action("secret-again", `{"containers":[{"name":"task","volumeMounts":[{"name":"flyte-secret-0","mountPath":"/again"}]}]}`), `"flyte-secret-0"`},
		{action("inputs-volume", `{"volumes":[{"name":"flyte-inputs","emptyDir":{}}]}`), "reserved"},
		{action("node-name", `{"nodeName":"gpu-node-7"}`), "nodeName: the executor's k8s.inlinePodTemplateFields does not list it"},
		{action("tolerate-all", `{"tolerations":[{"operator":"Exists"}]}`), "tolerations: the executor's k8s.inlinePodTemplateFields"},
		{action("critical", `{"priorityClassName":"system-node-critical"}`), "priorityClassName"},
		{action("service-account", `{"serviceAccountName":"admin"}`), "serviceAccountName"},
		{action("secret-volume", `{"volumes":[{"name":"s","secret":{"secretName":"other"}}]}`), "references a Secret"},
		{action("privileged", `{"containers":[{"name":"task","securityContext":{"privileged":true}}]}`), "privileged"},
	}
	benign := action("benign", `{"nodeSelector":{"gpu":"a100"},"volumes":[{"name":"scratch","emptyDir":{}}],
		"containers":[{"name":"task","env":[{"name":"MODE","value":"fast"}],"volumeMounts":[{"name":"scratch","mountPath":"/scratch"}]}]}`)
	for _, tt := range refused {
		create(t, tt.action)
	}
	create(t, benign)

	for _, tt := range refused {
		ta := waitFailed(t, client.ObjectKeyFromObject(tt.action))
		if e := ta.Status.Error; e == nil || e.Code != podtemplate.CodeRefused || e.Kind != flytev1.ErrorKindUser || ta.Status.Attempts != 1 || !strings.Contains(e.Message, tt.says) {
			t.Errorf("%s: status %+v; want one attempt failed for good with %s saying %s", tt.action.Name, ta.Status, podtemplate.CodeRefused, tt.says)
		}
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{core.LabelAction: tt.action.Name}); err != nil || len(pods.Items) > 0 {
			t.Errorf("%s: %d pods (%v); want none", tt.action.Name, len(pods.Items), err)
		}
	}

	pod := waitPod(t, ns, "benign-1")
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Image != "registry.k8s.io/pause:3.10" {
		t.Errorf("benign: init containers %+v; want the template's, as it is", pod.Spec.InitContainers)
	}
	c := pod.Spec.Containers[0]
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if _, twice := mounts[m.Name]; twice {
			t.Errorf("benign: volume %s mounted twice", m.Name)
		}
		mounts[m.Name] = m
	}
	if !mounts[flytek8s.InputsVolume].ReadOnly || mounts["scratch"].MountPath != "/scratch" || mounts["nvidia-driver"].Name != "" ||
		pod.Spec.NodeSelector["gpu"] != "a100" || c.SecurityContext != nil {
		t.Errorf("benign: task container %+v, node selector %v; want the staged inputs read-only once, the fragment's scratch, no host volume",
			c, pod.Spec.NodeSelector)
	}
}

// TestTemplateDefaultsStayTheTemplates: a template whose "default" container names an
// untagged placeholder image (as Flyte's docs show) is stored by the real API server with
// imagePullPolicy Always, a termination message path and policy, a DNS policy, a
// grace period and more filled in; none of it is the author's, so the task's pod (for a
// tagged image) gets IfNotPresent, the API server's default for its own image, and an
// action's fragment may set the grace period the template left to the API server.
func TestTemplateDefaultsStayTheTemplates(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	tpl := podTemplate(ns, "placeholder", true, corev1.PodSpec{Containers: []corev1.Container{{Name: podtemplate.DefaultContainer,
		Image: "docker.io/rwgrim/docker-noop", Env: []corev1.EnvVar{{Name: "FROM", Value: "template"}}}}})
	create(t, tpl)
	var got corev1.PodTemplate
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tpl), &got); err != nil {
		t.Fatal(err)
	}
	if c := got.Template.Spec.Containers[0]; c.ImagePullPolicy != corev1.PullAlways {
		t.Fatalf("the API server stored the template's container with imagePullPolicy %q; the test needs its default, Always", c.ImagePullPolicy)
	}
	cfg := testConfig()
	cfg.K8s.DefaultPodTemplateName = "placeholder"
	run(t, cfg, ns, nil)

	plain := containerAction(ns, "plain", 0)
	grace := containerAction(ns, "grace", 0)
	grace.Spec.PodTemplate = &flytev1.PodTemplate{Spec: runtime.RawExtension{Raw: []byte(`{"terminationGracePeriodSeconds":7}`)}}
	create(t, plain)
	create(t, grace)

	pod := waitPod(t, ns, "plain-1")
	c := pod.Spec.Containers[0]
	if c.Name != flytek8s.ContainerName || c.Image != "busybox:1.36" || len(c.Env) == 0 {
		t.Fatalf("container %+v; want the task's, with the template's env", c)
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("the task's container (image %s) has imagePullPolicy %q; want IfNotPresent: the template's Always was the API server's default for its placeholder",
			c.Image, c.ImagePullPolicy)
	}
	pod = waitPod(t, ns, "grace-1")
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g != 7 {
		t.Errorf("grace: terminationGracePeriodSeconds %v; want the fragment's 7", g)
	}
}
