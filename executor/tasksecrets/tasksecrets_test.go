package tasksecrets_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/tasksecrets"
)

func envFrom(name, secret, key string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key, Optional: new(bool)}}}
}

func volume(name, secret string, items ...corev1.KeyToPath) corev1.Volume {
	mode := int32(0o444)
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: secret, Items: items, DefaultMode: &mode, Optional: new(bool)}}}
}

// pod is a task's pod as a plugin builds it before the secrets: a task container with the
// executor's variable and a data mount, and a helper of the plugin's own.
func pod() corev1.PodSpec {
	return corev1.PodSpec{
		Volumes: []corev1.Volume{{Name: "flyte-inputs"}},
		Containers: []corev1.Container{
			{Name: "task", Env: []corev1.EnvVar{{Name: "FLYTE_ATTEMPT", Value: "1"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "flyte-inputs", MountPath: "/data/in/"}}},
			{Name: "helper"},
		},
	}
}

func TestApply(t *testing.T) {
	tests := []struct {
		name       string
		secrets    []flytev1.TaskSecret
		containers []string
		want       func(*corev1.PodSpec) // the change to pod(); nil when wantErr
		wantErr    string
	}{
		{name: "none", containers: []string{"task"}, want: func(*corev1.PodSpec) {}},
		{name: "a key as env", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", Key: "password", Env: "DB_PASSWORD"}},
			want: func(p *corev1.PodSpec) {
				p.Containers[0].Env = append(p.Containers[0].Env, envFrom("DB_PASSWORD", "db", "password"))
			}},
		{name: "a key as a file, the whole Secret as files", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", Key: "password", MountPath: "/etc/db"}, {Name: "tls", MountPath: "/etc/tls"}},
			want: func(p *corev1.PodSpec) {
				p.Volumes = append(p.Volumes, volume("flyte-secret-0", "db", corev1.KeyToPath{Key: "password", Path: "password"}), volume("flyte-secret-1", "tls"))
				p.Containers[0].VolumeMounts = append(p.Containers[0].VolumeMounts,
					corev1.VolumeMount{Name: "flyte-secret-0", MountPath: "/etc/db", ReadOnly: true},
					corev1.VolumeMount{Name: "flyte-secret-1", MountPath: "/etc/tls", ReadOnly: true})
			}},
		{name: "every named container, volumes named by index", containers: []string{"task", "helper"},
			secrets: []flytev1.TaskSecret{{Name: "db", Key: "user", Env: "DB_USER"}, {Name: "db", MountPath: "/etc/db"}},
			want: func(p *corev1.PodSpec) {
				p.Volumes = append(p.Volumes, volume("flyte-secret-1", "db"))
				for i := range p.Containers {
					p.Containers[i].Env = append(p.Containers[i].Env, envFrom("DB_USER", "db", "user"))
					p.Containers[i].VolumeMounts = append(p.Containers[i].VolumeMounts, corev1.VolumeMount{Name: "flyte-secret-1", MountPath: "/etc/db", ReadOnly: true})
				}
			}},
		{name: "a path beside a mount is no overlap", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", MountPath: "/data/input"}},
			want: func(p *corev1.PodSpec) {
				p.Volumes = append(p.Volumes, volume("flyte-secret-0", "db"))
				p.Containers[0].VolumeMounts = append(p.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "flyte-secret-0", MountPath: "/data/input", ReadOnly: true})
			}},

		{name: "an env the container sets", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", Key: "a", Env: "FLYTE_ATTEMPT"}}, wantErr: "spec.secrets[0]: env FLYTE_ATTEMPT is already set in container task"},
		{name: "an env twice", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", Key: "a", Env: "A"}, {Name: "db", Key: "b", Env: "A"}}, wantErr: "spec.secrets[1]: env A is already set"},
		{name: "a container's mount", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", MountPath: "/data/in"}}, wantErr: "spec.secrets[0]: mountPath /data/in overlaps /data/in/, where container task mounts flyte-inputs"},
		{name: "inside a container's mount", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", MountPath: "/data/in/db"}}, wantErr: "overlaps /data/in/"},
		{name: "around a container's mount", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", MountPath: "/data"}}, wantErr: "overlaps /data/in/"},
		{name: "nested entries", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", MountPath: "/etc/db"}, {Name: "tls", MountPath: "/etc/db/tls"}}, wantErr: "spec.secrets[1]: mountPath /etc/db/tls overlaps /etc/db"},
		{name: "both env and mountPath", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", Key: "a", Env: "A", MountPath: "/etc/db"}}, wantErr: "set exactly one of env and mountPath"},
		{name: "env without a key", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", Env: "A"}}, wantErr: "env needs a key"},
		{name: "a relative path", containers: []string{"task"},
			secrets: []flytev1.TaskSecret{{Name: "db", MountPath: "etc/db"}}, wantErr: "not an absolute directory"},
		{name: "no such container", containers: []string{"main"},
			secrets: []flytev1.TaskSecret{{Name: "db", Key: "a", Env: "A"}}, wantErr: `no container "main"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pod()
			err := tasksecrets.Apply(&got, tt.secrets, tt.containers...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v; want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := pod()
			tt.want(&want)
			if !equality.Semantic.DeepEqual(want, got) {
				w, _ := yaml.Marshal(want)
				g, _ := yaml.Marshal(got)
				t.Fatalf("pod spec\n%s\nwant\n%s", g, w)
			}
		})
	}
}

func TestMissing(t *testing.T) {
	secrets := []flytev1.TaskSecret{
		{Name: "db", Key: "password", Env: "DB_PASSWORD"},
		{Name: "db", Key: "password", MountPath: "/etc/db"},
		{Name: "tls", MountPath: "/etc/tls"},
		{Name: "db", Key: "user", Env: "DB_USER"},
	}
	tests := []struct {
		name, message, want string // want "" when the message is not about a missing Secret
	}{
		{"env, no Secret", `secret "db" not found`,
			`Secret "db" does not exist (spec.secrets[0], env DB_PASSWORD; spec.secrets[1], mountPath /etc/db; spec.secrets[3], env DB_USER)`},
		{"env, no key", `couldn't find key password in Secret ns-1/db`,
			`Secret "db" key "password" does not exist (spec.secrets[0], env DB_PASSWORD; spec.secrets[1], mountPath /etc/db)`},
		{"env, no key, older kubelets", `Couldn't find key user in Secret ns-1/db`, `Secret "db" key "user" does not exist (spec.secrets[3], env DB_USER)`},
		{"volume, no Secret", `MountVolume.SetUp failed for volume "flyte-secret-2" : secret "tls" not found`,
			`Secret "tls" does not exist (spec.secrets[2], mountPath /etc/tls)`},
		{"volume, no key", `MountVolume.SetUp failed for volume "flyte-secret-1" : references non-existent secret key: password`,
			`Secret "db" key "password" does not exist (spec.secrets[0], env DB_PASSWORD; spec.secrets[1], mountPath /etc/db)`},
		{"a volume not of spec.secrets", `MountVolume.SetUp failed for volume "certs" : references non-existent secret key: ca.pem`,
			`key "ca.pem" of a Secret does not exist`},
		{"a Secret not of spec.secrets", `secret "other" not found`, `Secret "other" does not exist`},
		{"the API's spelling", `secrets "tls" not found`, `Secret "tls" does not exist (spec.secrets[2], mountPath /etc/tls)`},
		{"a ConfigMap", `configmap "settings" not found`, ""},
		{"the kubelet's cache not yet synced", `failed to sync secret cache: timed out waiting for the condition`, ""},
		{"another mount failure", `MountVolume.SetUp failed for volume "data" : mount failed: exit status 32`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tasksecrets.Missing(secrets, tt.message)
			if got != tt.want || ok != (tt.want != "") {
				t.Fatalf("Missing(%q) = %q, %v; want %q", tt.message, got, ok, tt.want)
			}
		})
	}
}
