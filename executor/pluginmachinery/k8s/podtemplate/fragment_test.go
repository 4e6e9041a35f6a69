package podtemplate_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// gpuTemplate is a platform's template as GPU driver set-up templates are: a privileged
// init container with a hostPath volume, a shared volume the task's container mounts,
// a hardened task container, a node pool and a label.
func gpuTemplate() *corev1.PodTemplateSpec {
	hostDir := corev1.HostPathDirectory
	return &corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "ml"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"pool": "gpu"},
			Volumes: []corev1.Volume{
				{Name: "nvidia-driver", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/nvidia", Type: &hostDir}}},
				{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			InitContainers: []corev1.Container{{
				Name: "driver-setup", Image: "nvidia/driver:550", Command: []string{"/install"},
				SecurityContext: &corev1.SecurityContext{Privileged: new(true)},
				VolumeMounts:    []corev1.VolumeMount{{Name: "nvidia-driver", MountPath: "/run/nvidia"}},
			}},
			Containers: []corev1.Container{{
				Name: podtemplate.DefaultContainer, Image: "placeholder", Env: env("HTTPS_PROXY", "http://proxy"),
				VolumeMounts:    []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}},
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: new(true)},
			}},
		},
	}
}

// executorPod is a task pod as the executor builds it with k8s.mountFileStorage and
// spec.secrets: its own hostPath mounts of the staged data and a Secret volume.
func executorPod() *corev1.Pod {
	file, dir := corev1.HostPathFile, corev1.HostPathDirectory
	return &corev1.Pod{Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Volumes: []corev1.Volume{
			{Name: "flyte-inputs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data/.flyte-staging/u-1/inputs.pb", Type: &file}}},
			{Name: "flyte-outputs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data/.flyte-staging/u-1/out", Type: &dir}}},
			{Name: "flyte-secret-0", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db"}}},
		},
		Containers: []corev1.Container{{Name: task, Image: "python:3.12", VolumeMounts: []corev1.VolumeMount{
			{Name: "flyte-inputs", MountPath: "/data/inputs.pb", ReadOnly: true},
			{Name: "flyte-outputs", MountPath: "/data/out"},
			{Name: "flyte-secret-0", MountPath: "/etc/db", ReadOnly: true},
		}}},
	}}
}

// defaults is the executor's default configuration of inline fragments.
func defaults() podtemplate.Config {
	return config.Default().K8s.Config
}

// layInline decodes spec as an action's fragment and lays it over base, as the
// executor does, with the pod of executorPod.
func layInline(cfg podtemplate.Config, base *corev1.PodTemplateSpec, spec string, labels map[string]string) (*corev1.PodTemplateSpec, error) {
	s := podtemplate.Source{Config: cfg}
	a := inline(spec)
	a.Spec.PodTemplate.Metadata.Labels = labels
	over, err := s.Inline(a)
	if err != nil {
		return nil, err
	}
	return s.LayInline(base, over, executorPod(), task)
}

// TestAFragmentOnlyAdds: an action's fragment may add containers, volumes and fields of
// its own and add to the task's container, but never take over what the platform's
// template or the executor put in the pod: a template's container or volume, the
// executor's volumes, a value the template sets, or a field the platform keeps.
func TestAFragmentOnlyAdds(t *testing.T) {
	withTolerations := defaults()
	withTolerations.InlinePodTemplateFields = append(slices.Clone(withTolerations.InlinePodTemplateFields), "tolerations")
	privilegedTask := gpuTemplate()
	privilegedTask.Spec.Containers[0].SecurityContext.Privileged = new(true)

	tests := []struct {
		name   string
		cfg    *podtemplate.Config // defaults when nil
		base   *corev1.PodTemplateSpec
		spec   string
		labels map[string]string
		says   []string // "" for accepted: what the refusal names
	}{
		// A template's containers and volumes are the platform's.
		{name: "takeover of the privileged init container by name", spec: `{"initContainers":[{"name":"driver-setup","image":"evil:1","command":["sh","-c","cat /dev/mem"]}]}`,
			says: []string{"initContainers", "driver-setup"}},
		{name: "an env var into the privileged init container", spec: `{"initContainers":[{"name":"driver-setup","env":[{"name":"LD_PRELOAD","value":"/x.so"}]}]}`,
			says: []string{"driver-setup"}},
		{name: "a regular container named as the template's init container", spec: `{"containers":[{"name":"driver-setup","image":"evil:1"}]}`,
			says: []string{"driver-setup"}},
		{name: "an init container named as the task's container", spec: `{"initContainers":[{"name":"task","image":"b:1"}]}`,
			says: []string{"initContainers[task]"}},
		{name: "the task container mounts the template's hostPath volume", spec: `{"containers":[{"name":"task","volumeMounts":[{"name":"nvidia-driver","mountPath":"/host"}]}]}`,
			says: []string{"nvidia-driver", "mounts only volumes it defines"}},
		{name: "the default container mounts the template's hostPath volume", spec: `{"containers":[{"name":"default","volumeMounts":[{"name":"nvidia-driver","mountPath":"/host"}]}]}`,
			says: []string{"nvidia-driver"}},
		{name: "a sidecar of its own mounts the template's volume", spec: `{"initContainers":[{"name":"peek","image":"b:1","restartPolicy":"Always","volumeMounts":[{"name":"shared","mountPath":"/s"}]}]}`,
			says: []string{"shared"}},
		{name: "a volume named as the template's", spec: `{"volumes":[{"name":"shared","emptyDir":{"medium":"Memory"}}]}`,
			says: []string{"volumes", "shared"}},
		{name: "a mount over the template's mount path", spec: `{"volumes":[{"name":"mine","emptyDir":{}}],"containers":[{"name":"task","volumeMounts":[{"name":"mine","mountPath":"/shared"}]}]}`,
			says: []string{"volumeMounts", "/shared"}},

		// The executor's own volumes.
		{name: "flyte-inputs mounted again, writable", spec: `{"containers":[{"name":"task","volumeMounts":[{"name":"flyte-inputs","mountPath":"/rw"}]}]}`,
			says: []string{"flyte-inputs"}},
		{name: "flyte-inputs mounted again, read-only", spec: `{"containers":[{"name":"task","volumeMounts":[{"name":"flyte-inputs","mountPath":"/ro","readOnly":true}]}]}`,
			says: []string{"flyte-inputs"}},
		{name: "flyte-outputs mounted in a sidecar", spec: `{"initContainers":[{"name":"s","image":"b:1","restartPolicy":"Always","volumeMounts":[{"name":"flyte-outputs","mountPath":"/o"}]}]}`,
			says: []string{"flyte-outputs"}},
		{name: "a Secret volume of spec.secrets mounted again", spec: `{"containers":[{"name":"task","volumeMounts":[{"name":"flyte-secret-0","mountPath":"/again"}]}]}`,
			says: []string{"flyte-secret-0"}},
		{name: "a volume of its own named flyte-inputs", spec: `{"volumes":[{"name":"flyte-inputs","emptyDir":{}}]}`,
			says: []string{"flyte-inputs", "reserved"}},
		{name: "a volume of its own named as a later Secret volume", spec: `{"volumes":[{"name":"flyte-secret-7","emptyDir":{}}]}`,
			says: []string{"flyte-secret-7", "reserved"}},
		{name: "a reserved name without a template", base: &corev1.PodTemplateSpec{}, spec: `{"volumes":[{"name":"flyte-outputs","emptyDir":{}}]}`,
			says: []string{"flyte-outputs"}},

		// What the template sets stays.
		{name: "the template's hardening undone", spec: `{"containers":[{"name":"task","securityContext":{"runAsNonRoot":false}}]}`,
			says: []string{"runAsNonRoot"}},
		{name: "the template's node pool changed", spec: `{"nodeSelector":{"pool":"cpu"}}`,
			says: []string{"nodeSelector.pool"}},
		{name: "the template's env var changed", spec: `{"containers":[{"name":"default","env":[{"name":"HTTPS_PROXY","value":"http://evil"}]}]}`,
			says: []string{"HTTPS_PROXY"}},
		{name: "the template's label changed", spec: `{}`, labels: map[string]string{"team": "other"},
			says: []string{"label", "team"}},

		// Pod Security judges the task container as merged.
		{name: "an env var into a task container the template made privileged", base: privilegedTask, spec: `{"containers":[{"name":"task","env":[{"name":"X","value":"1"}]}]}`,
			says: []string{"privileged"}},
		{name: "a label beside a task container the template made privileged", base: privilegedTask, spec: `{}`, labels: map[string]string{"cost": "r"}},

		// Top-level fields: the platform's list.
		{name: "nodeName", spec: `{"nodeName":"gpu-node-7"}`, says: []string{"nodeName", "k8s.inlinePodTemplateFields"}},
		{name: "tolerate everything", spec: `{"tolerations":[{"operator":"Exists"}]}`, says: []string{"tolerations", "k8s.inlinePodTemplateFields"}},
		{name: "priorityClassName", spec: `{"priorityClassName":"system-node-critical"}`, says: []string{"priorityClassName", "k8s.inlinePodTemplateFields"}},
		{name: "priority", spec: `{"priority":2000001000}`, says: []string{"priority", "k8s.inlinePodTemplateFields"}},
		{name: "preemptionPolicy", spec: `{"preemptionPolicy":"PreemptLowerPriority"}`, says: []string{"preemptionPolicy"}},
		{name: "schedulerName", spec: `{"schedulerName":"mine"}`, says: []string{"schedulerName"}},
		{name: "affinity", spec: `{"affinity":{"podAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":[{"topologyKey":"kubernetes.io/hostname","namespaceSelector":{},"labelSelector":{}}]}}}`,
			says: []string{"affinity"}},
		{name: "topologySpreadConstraints", spec: `{"topologySpreadConstraints":[{"maxSkew":1,"topologyKey":"zone","whenUnsatisfiable":"DoNotSchedule"}]}`, says: []string{"topologySpreadConstraints"}},
		{name: "runtimeClassName", spec: `{"runtimeClassName":"runc"}`, says: []string{"runtimeClassName"}},
		{name: "serviceAccountName", spec: `{"serviceAccountName":"admin"}`, says: []string{"serviceAccountName", "k8s.inlinePodTemplateFields"}},
		{name: "serviceAccount", spec: `{"serviceAccount":"admin"}`, says: []string{"serviceAccount"}},
		{name: "automountServiceAccountToken", spec: `{"automountServiceAccountToken":true}`, says: []string{"automountServiceAccountToken"}},
		{name: "hostAliases", spec: `{"hostAliases":[{"ip":"127.0.0.1","hostnames":["proxy"]}]}`, says: []string{"hostAliases"}},
		{name: "shareProcessNamespace", spec: `{"shareProcessNamespace":true}`, says: []string{"shareProcessNamespace"}},
		{name: "imagePullSecrets", spec: `{"imagePullSecrets":[{"name":"registry"}]}`, says: []string{"imagePullSecrets"}},
		{name: "a field set to null is still set", spec: `{"nodeName":null}`, says: []string{"nodeName"}},
		{name: "tolerations once the platform lists them", cfg: &withTolerations, spec: `{"tolerations":[{"key":"dedicated","operator":"Exists"}]}`},

		// Secrets reach a task only through spec.secrets.
		{name: "a Secret volume", spec: `{"volumes":[{"name":"s","secret":{"secretName":"db"}}]}`, says: []string{"volumes[0].secret"}},
		{name: "a projected Secret", spec: `{"volumes":[{"name":"p","projected":{"sources":[{"secret":{"name":"db"}}]}}]}`, says: []string{"projected.sources[0].secret"}},
		{name: "a CSI volume's Secret", spec: `{"volumes":[{"name":"c","csi":{"driver":"d","nodePublishSecretRef":{"name":"db"}}}]}`, says: []string{"nodePublishSecretRef"}},
		{name: "a CephFS volume's Secret", spec: `{"volumes":[{"name":"c","cephfs":{"monitors":["m"],"secretRef":{"name":"db"}}}]}`, says: []string{"cephfs.secretRef"}},
		{name: "an Azure file volume's Secret", spec: `{"volumes":[{"name":"a","azureFile":{"secretName":"db","shareName":"s"}}]}`, says: []string{"azureFile.secretName"}},
		{name: "envFrom a Secret", spec: `{"containers":[{"name":"task","envFrom":[{"secretRef":{"name":"db"}}]}]}`, says: []string{"envFrom[0].secretRef"}},
		{name: "an env var from a Secret", spec: `{"containers":[{"name":"task","env":[{"name":"P","valueFrom":{"secretKeyRef":{"name":"db","key":"p"}}}]}]}`,
			says: []string{"secretKeyRef"}},
		{name: "an init container's env from a Secret", spec: `{"initContainers":[{"name":"s","image":"b:1","envFrom":[{"secretRef":{"name":"db"}}]}]}`,
			says: []string{"initContainers[0].envFrom[0].secretRef"}},

		// What a fragment is for still works.
		{name: "an allowed fragment", labels: map[string]string{"cost": "research"},
			spec: `{"nodeSelector":{"gpu":"a100"},"terminationGracePeriodSeconds":5,"activeDeadlineSeconds":600,
				"volumes":[{"name":"scratch","emptyDir":{}}],
				"containers":[{"name":"task","env":[{"name":"MODE","value":"fast"}],"volumeMounts":[{"name":"scratch","mountPath":"/scratch"}]}],
				"initContainers":[{"name":"warm","image":"b:1","restartPolicy":"Always","volumeMounts":[{"name":"scratch","mountPath":"/scratch"}]}]}`},
		{name: "an allowed fragment without a template", base: &corev1.PodTemplateSpec{},
			spec: `{"nodeSelector":{"gpu":"a100"},"containers":[{"name":"default","env":[{"name":"MODE","value":"fast"}]}]}`},
		{name: "the template's own values repeated", spec: `{"nodeSelector":{"pool":"gpu"},"containers":[{"name":"task","env":[{"name":"HTTPS_PROXY","value":"http://proxy"}]}]}`,
			labels: map[string]string{"team": "ml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaults()
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			base := tt.base
			if base == nil {
				base = gpuTemplate()
			}
			merged, err := layInline(cfg, base, tt.spec, tt.labels)
			var perr *podtemplate.Error
			switch {
			case len(tt.says) == 0 && err != nil:
				t.Fatalf("refused: %v", err)
			case len(tt.says) == 0 && merged == nil:
				t.Fatal("no template")
			case len(tt.says) == 0:
			case !errors.As(err, &perr) || perr.Code != podtemplate.CodeRefused:
				t.Fatalf("err %v; want %s", err, podtemplate.CodeRefused)
			default:
				t.Log(err)
				for _, s := range tt.says {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("err %q; want it to name %q", err, s)
					}
				}
			}
		})
	}
}

// What an allowed fragment adds is in the merged template, beside all of the template's.
func TestAnAllowedFragmentAdds(t *testing.T) {
	merged, err := layInline(defaults(), gpuTemplate(), `{"nodeSelector":{"gpu":"a100"},"volumes":[{"name":"scratch","emptyDir":{}}],
		"containers":[{"name":"task","env":[{"name":"MODE","value":"fast"}],"volumeMounts":[{"name":"scratch","mountPath":"/scratch"}]}]}`,
		map[string]string{"cost": "research"})
	if err != nil {
		t.Fatal(err)
	}
	c := container(&merged.Spec, task)
	if c == nil || len(c.Env) != 2 || len(c.VolumeMounts) != 2 || c.SecurityContext == nil || c.SecurityContext.RunAsNonRoot == nil {
		t.Fatalf("task container %+v; want the template's env, mount and security context with the fragment's", c)
	}
	if merged.Spec.NodeSelector["pool"] != "gpu" || merged.Spec.NodeSelector["gpu"] != "a100" || len(merged.Spec.Volumes) != 3 ||
		len(merged.Spec.InitContainers) != 1 || merged.Labels["team"] != "ml" || merged.Labels["cost"] != "research" {
		t.Errorf("merged %+v; want the template's and the fragment's", merged)
	}
}
