package podtemplate_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// stored is spec as the API server stores a PodTemplate: with the defaults of
// k8s.io/kubernetes pkg/apis/core/v1 (SetDefaults_PodSpec, SetDefaults_Container) filled
// in where spec leaves them empty.
func stored(spec corev1.PodSpec) corev1.PodSpec {
	spec = *spec.DeepCopy()
	if spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirst
	}
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.TerminationGracePeriodSeconds == nil {
		spec.TerminationGracePeriodSeconds = new(int64(corev1.DefaultTerminationGracePeriodSeconds))
	}
	if spec.SchedulerName == "" {
		spec.SchedulerName = corev1.DefaultSchedulerName
	}
	spec.DeprecatedServiceAccount = spec.ServiceAccountName
	for _, list := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range list {
			c := &list[i]
			if c.ImagePullPolicy == "" {
				c.ImagePullPolicy = corev1.PullIfNotPresent
				if tagless := map[string]bool{"placeholder": true, "example.com/noop": true, "noop:latest": true, "proxy": true}; tagless[c.Image] {
					c.ImagePullPolicy = corev1.PullAlways
				}
			}
			if c.TerminationMessagePath == "" {
				c.TerminationMessagePath = corev1.TerminationMessagePathDefault
			}
			if c.TerminationMessagePolicy == "" {
				c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
			}
		}
	}
	return spec
}

// What the API server filled in when it stored a template is not the template's
// author's: the task's container and pod get the API server's defaults for themselves
// (for the task's own image), and what the author set is kept, even where it equals a
// default of some other image.
func TestTemplateDefaultsOfTheAPIServerAreNotTheTasks(t *testing.T) {
	tests := []struct {
		name     string
		template corev1.PodSpec // as its author wrote it
		// What the task's container and pod get from the template.
		pull      corev1.PullPolicy
		msgPath   string
		msgPolicy corev1.TerminationMessagePolicy
		check     func(t *testing.T, spec *corev1.PodSpec)
	}{
		{name: "untagged placeholder", template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "placeholder"}}}},
		{name: "untagged placeholder with a registry", template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "example.com/noop"}}}},
		{name: "latest placeholder", template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "noop:latest"}}}},
		{name: "tagged placeholder", template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "registry.k8s.io/pause:3.10"}}}},
		{name: "placeholder by digest", template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default",
			Image: "registry.k8s.io/pause@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a"}}}},
		{name: "a template container named after the task's", template: corev1.PodSpec{Containers: []corev1.Container{{Name: task, Image: "placeholder"}}}},
		{name: "Always on a tagged image is the author's", pull: corev1.PullAlways,
			template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "pause:3.10", ImagePullPolicy: corev1.PullAlways}}}},
		{name: "IfNotPresent on an untagged image is the author's", pull: corev1.PullIfNotPresent,
			template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "placeholder", ImagePullPolicy: corev1.PullIfNotPresent}}}},
		{name: "Never is the author's", pull: corev1.PullNever,
			template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "placeholder", ImagePullPolicy: corev1.PullNever}}}},
		{name: "termination message settings are the author's", msgPath: "/tmp/why", msgPolicy: corev1.TerminationMessageFallbackToLogsOnError,
			template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "placeholder",
				TerminationMessagePath: "/tmp/why", TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}}}},
		{name: "pod-level defaults", template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "placeholder"}}},
			check: func(t *testing.T, spec *corev1.PodSpec) {
				if spec.DNSPolicy != "" || spec.SchedulerName != "" || spec.SecurityContext != nil || spec.TerminationGracePeriodSeconds != nil || spec.DeprecatedServiceAccount != "" {
					t.Errorf("dnsPolicy %q, schedulerName %q, securityContext %+v, terminationGracePeriodSeconds %v, serviceAccount %q; want none set",
						spec.DNSPolicy, spec.SchedulerName, spec.SecurityContext, spec.TerminationGracePeriodSeconds, spec.DeprecatedServiceAccount)
				}
			}},
		{name: "pod-level settings of the author", template: corev1.PodSpec{
			DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"10.0.0.10"}}, SchedulerName: "gang",
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: new(true)}, TerminationGracePeriodSeconds: new(int64(5)),
			Containers: []corev1.Container{{Name: "default", Image: "placeholder"}}},
			check: func(t *testing.T, spec *corev1.PodSpec) {
				if spec.DNSPolicy != corev1.DNSNone || spec.SchedulerName != "gang" || spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil ||
					spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds != 5 {
					t.Errorf("pod spec %+v; want the template's own dnsPolicy, schedulerName, securityContext and grace period", spec)
				}
			}},
		{name: "a sidecar keeps its own image's",
			template: corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "placeholder"}},
				InitContainers: []corev1.Container{{Name: "sidecar", Image: "proxy", RestartPolicy: new(corev1.ContainerRestartPolicyAlways)}}},
			check: func(t *testing.T, spec *corev1.PodSpec) {
				if len(spec.InitContainers) != 1 || spec.InitContainers[0].ImagePullPolicy != "" || spec.InitContainers[0].TerminationMessagePath != "" {
					t.Errorf("init containers %+v; want the sidecar without the API server's defaults (the pod's API server gives them again)", spec.InitContainers)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tpl := &corev1.PodTemplate{
				ObjectMeta: metav1.ObjectMeta{Name: "platform", Namespace: "ns", Labels: map[string]string{podtemplate.Label: "true"}},
				Template:   corev1.PodTemplateSpec{Spec: stored(tt.template)},
			}
			reader := fake.NewClientBuilder().WithObjects(tpl).Build()
			s := podtemplate.Source{Config: podtemplate.Config{DefaultPodTemplateName: "platform"}, Reader: reader}
			action := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}
			base, err := s.Base(context.Background(), action)
			if err != nil || base == nil {
				t.Fatalf("base %v, err %v", base, err)
			}
			pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: task, Image: "ghcr.io/team/model:v3"}}}}
			if err := podtemplate.Apply(base, pod, task); err != nil {
				t.Fatal(err)
			}
			c := pod.Spec.Containers[0]
			if c.Name != task || c.Image != "ghcr.io/team/model:v3" {
				t.Fatalf("first container %+v; want the task's", c)
			}
			if c.ImagePullPolicy != tt.pull {
				t.Errorf("imagePullPolicy %q; want %q", c.ImagePullPolicy, tt.pull)
			}
			if c.TerminationMessagePath != tt.msgPath || c.TerminationMessagePolicy != tt.msgPolicy {
				t.Errorf("terminationMessagePath %q, terminationMessagePolicy %q; want %q, %q", c.TerminationMessagePath, c.TerminationMessagePolicy, tt.msgPath, tt.msgPolicy)
			}
			if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restartPolicy %q; want the task pod's Never", pod.Spec.RestartPolicy)
			}
			if tt.check != nil {
				tt.check(t, &pod.Spec)
			}
		})
	}
}

// An action's fragment may set what the template's author left to the API server (its
// grace period, the task container's pull policy), and it is not refused as a change
// of what the template sets.
func TestInlineFragmentMaySetWhatTheTemplateLeftToTheAPIServer(t *testing.T) {
	tpl := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "platform", Namespace: "ns", Labels: map[string]string{podtemplate.Label: "true"}},
		Template:   corev1.PodTemplateSpec{Spec: stored(corev1.PodSpec{Containers: []corev1.Container{{Name: "default", Image: "placeholder"}}})},
	}
	s := podtemplate.Source{Config: defaults(), Reader: fake.NewClientBuilder().WithObjects(tpl).Build()}
	s.Config.DefaultPodTemplateName = "platform"
	action := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}
	action.Spec.PodTemplate = &flytev1.PodTemplate{Spec: runtime.RawExtension{Raw: []byte(
		`{"terminationGracePeriodSeconds":10,"dnsPolicy":"Default","containers":[{"name":"task","imagePullPolicy":"Never"}]}`)}}
	base, err := s.Base(context.Background(), action)
	if err != nil {
		t.Fatal(err)
	}
	inline, err := s.Inline(action)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: task, Image: "model:v3"}}}}
	merged, err := s.LayInline(base, inline, pod, task)
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	if err := podtemplate.Apply(merged, pod, task); err != nil {
		t.Fatal(err)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g != 10 || pod.Spec.DNSPolicy != corev1.DNSDefault || pod.Spec.Containers[0].ImagePullPolicy != corev1.PullNever {
		t.Errorf("pod spec %+v; want the fragment's grace period, DNS policy and pull policy", pod.Spec)
	}
}
