package podtemplate

import (
	// The image reference parser checks a digest's algorithm against the linked hashes,
	// as the API server's does.
	_ "crypto/sha256"
	_ "crypto/sha512"
	"reflect"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
)

// withoutServerDefaults clears, in spec as the API server stored it, each value equal
// to the one the API server fills in where a PodTemplate leaves a field empty
// (SetDefaults_PodSpec and SetDefaults_Container of k8s.io/kubernetes
// pkg/apis/core/v1): such a value cannot be told from its author's, and read as the
// author's it is carried into the task's pod, where it was never meant. The pull policy
// the API server derives from the template's image, a placeholder the task's image
// replaces, is the one that hurts: an untagged placeholder gets Always, and the task's
// image, present on the node, would be pulled. The task's pod gets the API server's
// defaults for itself instead. An author who set a cleared value on purpose gets the
// same from the pod's defaults, but for the pull policy, which follows the task's image
// (docs/executor.md, "Pod templates").
//
// The other defaults (probe timings, volume modes, port protocols, a fieldRef's
// apiVersion) are kept: they belong to items of the template's own, which reach the
// pod as they are and would get the same values there.
func withoutServerDefaults(spec *corev1.PodSpec) {
	if spec.DNSPolicy == corev1.DNSClusterFirst {
		spec.DNSPolicy = ""
	}
	if spec.RestartPolicy == corev1.RestartPolicyAlways {
		spec.RestartPolicy = ""
	}
	if sc := spec.SecurityContext; sc != nil && reflect.DeepEqual(*sc, corev1.PodSecurityContext{}) {
		spec.SecurityContext = nil
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil && *g == corev1.DefaultTerminationGracePeriodSeconds {
		spec.TerminationGracePeriodSeconds = nil
	}
	if spec.SchedulerName == corev1.DefaultSchedulerName {
		spec.SchedulerName = ""
	}
	// The deprecated alias is copied from serviceAccountName; left, it would name the
	// template's account beside the action's.
	if spec.DeprecatedServiceAccount == spec.ServiceAccountName {
		spec.DeprecatedServiceAccount = ""
	}
	for _, list := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range list {
			c := &list[i]
			if c.ImagePullPolicy == defaultPullPolicy(c.Image) {
				c.ImagePullPolicy = ""
			}
			if c.TerminationMessagePath == corev1.TerminationMessagePathDefault {
				c.TerminationMessagePath = ""
			}
			if c.TerminationMessagePolicy == corev1.TerminationMessageReadFile {
				c.TerminationMessagePolicy = ""
			}
		}
	}
}

// defaultPullPolicy is the pull policy the API server gives a container of image that
// sets none: Always for an image without a tag or digest, or tagged latest;
// IfNotPresent otherwise, an image it cannot parse included.
func defaultPullPolicy(image string) corev1.PullPolicy {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return corev1.PullIfNotPresent
	}
	tagged, hasTag := named.(reference.Tagged)
	_, hasDigest := named.(reference.Digested)
	if hasTag && tagged.Tag() == "latest" || !hasTag && !hasDigest {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}
