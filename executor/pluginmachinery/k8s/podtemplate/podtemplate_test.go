package podtemplate_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

const task = "task"

func env(kv ...string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for i := 0; i < len(kv); i += 2 {
		out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
	}
	return out
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// The pod a plugin builds, laid over a platform's template: what the action sets wins,
// what it leaves alone comes from the template.
func TestApplyLaysThePodOverTheTemplate(t *testing.T) {
	toleration := corev1.Toleration{Key: "gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	template := &corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "ml", "flyte.org/run": "forged"}, Annotations: map[string]string{"a": "1"}},
		Spec: corev1.PodSpec{
			Tolerations:  []corev1.Toleration{toleration},
			NodeSelector: map[string]string{"pool": "gpu"},
			Volumes:      []corev1.Volume{{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}},
			Containers: []corev1.Container{
				{Name: "sidecar", Image: "proxy:1"},
				{Name: podtemplate.DefaultContainer, Image: "placeholder", Env: env("HTTP_PROXY", "http://proxy", "MODE", "template"),
					VolumeMounts:    []corev1.VolumeMount{{Name: "shm", MountPath: "/dev/shm"}},
					Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
					SecurityContext: &corev1.SecurityContext{RunAsNonRoot: new(true)}},
			},
		},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"flyte.org/run": "r1"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: task, Image: "python:3.12", Command: []string{"python"}, Env: env("MODE", "action", "FLYTE_ATTEMPT", "1"),
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}},
		}}},
	}
	if err := podtemplate.Apply(template, pod, task); err != nil {
		t.Fatal(err)
	}
	if got := pod.Spec.Containers[0].Name; got != task {
		t.Errorf("first container %q; want the task's, first", got)
	}
	c := container(&pod.Spec, task)
	if c == nil || container(&pod.Spec, "sidecar") == nil || container(&pod.Spec, podtemplate.DefaultContainer) != nil {
		t.Fatalf("containers %+v; want the task's and the sidecar, no default", pod.Spec.Containers)
	}
	want := map[string]string{"HTTP_PROXY": "http://proxy", "MODE": "action", "FLYTE_ATTEMPT": "1"}
	got := map[string]string{}
	for _, e := range c.Env {
		got[e.Name] = e.Value
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("env %v; want %v (merged by name, the action's winning)", got, want)
	}
	if c.Image != "python:3.12" || len(c.VolumeMounts) != 1 || c.SecurityContext == nil || c.SecurityContext.RunAsNonRoot == nil {
		t.Errorf("task container %+v; want the action's image with the template's mount and security context", c)
	}
	if cpu, mem := c.Resources.Requests.Cpu(), c.Resources.Limits.Memory(); cpu.String() != "2" || mem.String() != "1Gi" {
		t.Errorf("resources %+v; want the action's request and the template's limit", c.Resources)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.NodeSelector["pool"] != "gpu" || len(pod.Spec.Tolerations) != 1 || len(pod.Spec.Volumes) != 1 {
		t.Errorf("pod spec %+v; want the template's placement and volume, the action's restart policy", pod.Spec)
	}
	if pod.Labels["team"] != "ml" || pod.Labels["flyte.org/run"] != "r1" || pod.Annotations["a"] != "1" {
		t.Errorf("metadata %v %v; want the template's labels under the pod's", pod.Labels, pod.Annotations)
	}
}

// An inline fragment goes over the named or default template: a container named after
// the task's applies to it after "default" does, tolerations are joined, env merged.
func TestMergeLaysTheFragmentOverTheBase(t *testing.T) {
	a := corev1.Toleration{Key: "a", Operator: corev1.TolerationOpExists}
	b := corev1.Toleration{Key: "b", Operator: corev1.TolerationOpEqual, Value: "x", Effect: corev1.TaintEffectNoExecute}
	c := corev1.Toleration{Key: "c", Operator: corev1.TolerationOpExists}
	base := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Tolerations: []corev1.Toleration{a, b},
		Containers:  []corev1.Container{{Name: podtemplate.DefaultContainer, Image: "p", Env: env("A", "base", "B", "base")}},
	}}
	over := &corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"x": "y"}},
		Spec: corev1.PodSpec{
			Tolerations: []corev1.Toleration{b, c},
			Containers: []corev1.Container{
				{Name: podtemplate.DefaultContainer, Env: env("B", "default")},
				{Name: task, Env: env("C", "task")},
			},
		}}
	got, err := podtemplate.Merge(base, over, task)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Tolerations) != 3 {
		t.Errorf("tolerations %+v; want a, b and c once each", got.Spec.Tolerations)
	}
	if len(got.Spec.Containers) != 1 || got.Spec.Containers[0].Name != task {
		t.Fatalf("containers %+v; want the task's alone", got.Spec.Containers)
	}
	vals := map[string]string{}
	for _, e := range got.Spec.Containers[0].Env {
		vals[e.Name] = e.Value
	}
	if want := map[string]string{"A": "base", "B": "default", "C": "task"}; !reflect.DeepEqual(vals, want) {
		t.Errorf("env %v; want %v", vals, want)
	}
	if got.Labels["x"] != "y" {
		t.Errorf("labels %v", got.Labels)
	}
	// Neither side changes.
	if len(base.Spec.Containers) != 1 || base.Spec.Containers[0].Name != podtemplate.DefaultContainer || len(over.Spec.Containers) != 2 {
		t.Errorf("Merge changed its arguments: %+v %+v", base.Spec.Containers, over.Spec.Containers)
	}
}

func inline(spec string) *flytev1.TaskAction {
	a := &flytev1.TaskAction{}
	a.Spec.PodTemplate = &flytev1.PodTemplate{Spec: runtime.RawExtension{Raw: []byte(spec)}}
	return a
}

func TestInlineFragments(t *testing.T) {
	tests := []struct {
		name, spec, level string
		code              string // "" for accepted
		says              string
	}{
		{name: "a node selector and a sidecar", spec: `{"nodeSelector":{"gpu":"a100"},"containers":[{"name":"sidecar","image":"s:1"}]}`},
		{name: "unknown field", spec: `{"tolerationz":[]}`, code: podtemplate.CodeInvalid, says: "tolerationz"},
		{name: "field of the wrong case", spec: `{"NodeSelector":{"a":"b"}}`, code: podtemplate.CodeInvalid, says: "NodeSelector"},
		{name: "wrong type", spec: `{"nodeSelector":["a"]}`, code: podtemplate.CodeInvalid, says: "nodeSelector"},
		{name: "host network", spec: `{"hostNetwork":true}`, code: podtemplate.CodeRefused, says: "host namespaces"},
		{name: "privileged container", spec: `{"containers":[{"name":"task","securityContext":{"privileged":true}}]}`, code: podtemplate.CodeRefused, says: "privileged"},
		{name: "hostPath volume", spec: `{"volumes":[{"name":"root","hostPath":{"path":"/"}}]}`, code: podtemplate.CodeRefused, says: "hostPath"},
		{name: "added capability", spec: `{"containers":[{"name":"task","securityContext":{"capabilities":{"add":["SYS_ADMIN"]}}}]}`, code: podtemplate.CodeRefused, says: "SYS_ADMIN"},
		{name: "host network when privileged is allowed", spec: `{"hostNetwork":true}`, level: podtemplate.LevelPrivileged},
		{name: "too large", spec: `{"nodeSelector":{"a":"` + strings.Repeat("x", podtemplate.MaxInlineBytes) + `"}}`, code: podtemplate.CodeInvalid, says: "bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaults()
			if tt.level != "" {
				cfg.InlinePodTemplateLevel = tt.level
			}
			s := podtemplate.Source{Config: cfg}
			got, err := s.Inline(inline(tt.spec))
			var perr *podtemplate.Error
			switch {
			case tt.code == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.code == "" && got == nil:
				t.Fatal("no template")
			case tt.code == "":
			case !errors.As(err, &perr) || perr.Code != tt.code || !strings.Contains(err.Error(), tt.says):
				t.Fatalf("err %v; want %s saying %q", err, tt.code, tt.says)
			}
		})
	}
}

// A map key that reads as a strategic merge patch's directive would delete what the
// base holds instead of laying something over it.
func TestMergeRefusesPatchDirectives(t *testing.T) {
	base := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{NodeSelector: map[string]string{"pool": "gpu", "zone": "a"}}}
	over := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{NodeSelector: map[string]string{"$patch": "replace", "x": "y"}}}
	_, err := podtemplate.Merge(base, over, task)
	var perr *podtemplate.Error
	if !errors.As(err, &perr) || perr.Code != podtemplate.CodeInvalid {
		t.Fatalf("err %v; want %s", err, podtemplate.CodeInvalid)
	}
}

// A fragment that sets no containers keeps the base's: a typed PodSpec marshals its
// containers as null, which a strategic merge patch takes for "delete".
func TestMergeKeepsWhatTheFragmentLeavesOut(t *testing.T) {
	base := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: podtemplate.DefaultContainer, Image: "p", Env: env("A", "base")}},
	}}
	over := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "x", Operator: corev1.TolerationOpExists}}}}
	got, err := podtemplate.Merge(base, over, task)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Containers) != 1 || len(got.Spec.Containers[0].Env) != 1 || len(got.Spec.Tolerations) != 1 {
		t.Fatalf("merged %+v; want the base's container and the fragment's toleration", got.Spec)
	}
}
