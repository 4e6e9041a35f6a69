// Package tasksecrets renders an action's spec.secrets into the pods a Kubernetes plugin
// creates, as references the kubelet resolves when it starts the task's containers: an
// environment variable from a Secret's key, or a read-only Secret volume. The executor
// never reads a Secret: a task's secret values reach only its pod.
//
// It also reads the kubelet's word that a referenced Secret or key does not exist, so that
// a plugin can fail the attempt as the user's error instead of waiting for it forever.
package tasksecrets

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// DefaultMode is the mode of the files of a Secret volume: read-only, and readable by
// whatever user the task's image runs as. The kubelet writes them owned by root, so
// 0400 would hide them from the non-root images hardened clusters require; the pod is
// the task's alone.
const DefaultMode int32 = 0o444

// volumePrefix begins the names of the Secret volumes; VolumeName adds the entry's index.
const volumePrefix = "flyte-secret-"

// VolumeName is the name of the volume that mounts spec.secrets[i].
func VolumeName(i int) string { return fmt.Sprintf("%s%d", volumePrefix, i) }

// Apply adds secrets to spec: a Secret volume for each entry with a mountPath, and to
// each of the named containers its environment variables and read-only mounts. Name the
// containers that run the task, never a helper of the plugin's own: they all see the
// secrets. The CRD refuses malformed entries; Apply refuses, besides, what only the built
// pod shows: an environment variable a container already sets (the executor's, the
// action's envVars or container env) or a mount path that is, contains or lies inside
// one a container already has (such as the file storage mounts).
func Apply(spec *corev1.PodSpec, secrets []flytev1.TaskSecret, containers ...string) error {
	if len(secrets) == 0 {
		return nil
	}
	targets := make([]*corev1.Container, 0, len(containers))
	for _, name := range containers {
		c := container(spec, name)
		if c == nil {
			return fmt.Errorf("tasksecrets: the pod has no container %q", name)
		}
		targets = append(targets, c)
	}
	for i, s := range secrets {
		field := fmt.Sprintf("spec.secrets[%d]", i)
		switch {
		case s.Name == "":
			return fmt.Errorf("%s: a Secret name is required", field)
		case (s.Env == "") == (s.MountPath == ""):
			return fmt.Errorf("%s: set exactly one of env and mountPath", field)
		case s.Env != "" && s.Key == "":
			return fmt.Errorf("%s: env needs a key", field)
		case s.MountPath != "" && (!path.IsAbs(s.MountPath) || path.Clean(s.MountPath) == "/"):
			return fmt.Errorf("%s: mountPath %q is not an absolute directory other than /", field, s.MountPath)
		}
		if s.Env != "" {
			env := corev1.EnvVar{Name: s.Env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: s.Name}, Key: s.Key, Optional: new(bool)}}}
			for _, c := range targets {
				for _, e := range c.Env {
					if e.Name == s.Env {
						return fmt.Errorf("%s: env %s is already set in container %s", field, s.Env, c.Name)
					}
				}
				c.Env = append(c.Env, env)
			}
			continue
		}
		volume := VolumeName(i)
		for _, v := range spec.Volumes {
			if v.Name == volume {
				return fmt.Errorf("%s: the pod already has a volume named %s", field, volume)
			}
		}
		mode := DefaultMode
		source := &corev1.SecretVolumeSource{SecretName: s.Name, DefaultMode: &mode, Optional: new(bool)}
		if s.Key != "" {
			source.Items = []corev1.KeyToPath{{Key: s.Key, Path: s.Key}}
		}
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{Secret: source}})
		for _, c := range targets {
			for _, m := range c.VolumeMounts {
				if overlap(m.MountPath, s.MountPath) {
					return fmt.Errorf("%s: mountPath %s overlaps %s, where container %s mounts %s", field, s.MountPath, m.MountPath, c.Name, m.Name)
				}
			}
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: s.MountPath, ReadOnly: true})
		}
	}
	return nil
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// overlap reports whether two absolute paths are the same directory or one lies inside
// the other: a mount there would hide, or be hidden by, the other.
func overlap(a, b string) bool {
	a, b = path.Clean(a), path.Clean(b)
	return a == b || within(a, b) || within(b, a)
}

func within(inner, outer string) bool {
	return strings.HasPrefix(inner, strings.TrimSuffix(outer, "/")+"/")
}
