package executor

import (
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// The informers of the objects plugins create keep what the executor reads of them, and
// not the spec that repeats the action's. A pod's command, arguments, environment and
// volumes are its action's (up to v1.MaxSpecTextLength of text), and the informer of
// actions holds them already: kept in full, every action would be held twice. What the
// executor reads of a pod is its metadata (labels, owner, finalizers, deletion), its
// node and its status; of a Job, its metadata, selector and status. It writes to them
// only with deletes and merge patches of what it changes (the finalizer), so a stripped
// copy never wipes the rest. Reads of other fields go to the API server (APIReader).

// cachedObjects strips managed fields from every object, as the default transform does,
// pods and Jobs to what the executor reads, and kubectl's last-applied copy from
// actions.
func cachedObjects() toolscache.TransformFunc {
	stripManagedFields := cache.TransformStripManagedFields()
	return func(obj any) (any, error) {
		obj, err := stripManagedFields(obj)
		if err != nil {
			return obj, err
		}
		switch o := obj.(type) {
		case *flytev1.TaskAction:
			// kubectl apply's copy of the whole object: the spec again. Status writes
			// keep the stored metadata, and the finalizer's patches touch only it.
			delete(o.Annotations, corev1.LastAppliedConfigAnnotation)
			boundInlinePodTemplate(o)
		case *corev1.Pod:
			o.Annotations = nil
			o.Spec = readPodSpec(&o.Spec)
		case *batchv1.Job:
			o.Annotations = nil
			o.Spec.Template = corev1.PodTemplateSpec{Spec: readPodSpec(&o.Spec.Template.Spec)}
		}
		return obj, nil
	}
}

// boundInlinePodTemplate keeps no more of an action's inline pod template than the
// executor reads: the API server bounds every other field of a spec, but not this one,
// whose schema is free-form (CEL can neither see nor measure it), so an action may carry
// about a megabyte of it. An oversized one is replaced by an empty object padded to one
// byte past podtemplate.MaxInlineBytes, which the plugin refuses as it would the whole.
// It stays valid JSON, since a status write sends the spec back (the API server keeps
// the stored one).
func boundInlinePodTemplate(ta *flytev1.TaskAction) {
	if pt := ta.Spec.PodTemplate; pt != nil && len(pt.Spec.Raw) > podtemplate.MaxInlineBytes+1 {
		pt.Spec = runtime.RawExtension{Raw: oversizedInlinePodTemplate}
	}
}

// oversizedInlinePodTemplate stands for every inline pod template over the bound; shared,
// as nothing writes to it.
var oversizedInlinePodTemplate = []byte("{" + strings.Repeat(" ", podtemplate.MaxInlineBytes-1) + "}")

// readPodSpec is what the executor reads of a pod's spec: its node. The containers keep
// their names, so that the pod still says what it runs, and the devices they ask for (the
// extended resources, such as nvidia.com/gpu), whose failed pods wait for a report of a
// device fault (k8s.deviceFaults.lateEventWait).
func readPodSpec(spec *corev1.PodSpec) corev1.PodSpec {
	names := func(cs []corev1.Container) []corev1.Container {
		var out []corev1.Container
		for _, c := range cs {
			out = append(out, corev1.Container{Name: c.Name, Resources: corev1.ResourceRequirements{
				Requests: devices(c.Resources.Requests), Limits: devices(c.Resources.Limits)}})
		}
		return out
	}
	return corev1.PodSpec{NodeName: spec.NodeName, InitContainers: names(spec.InitContainers), Containers: names(spec.Containers)}
}

// devices is the extended resources of list, nil if none: a name with a domain that is
// not Kubernetes' own (cpu, memory, hugepages-2Mi, … have none).
func devices(list corev1.ResourceList) corev1.ResourceList {
	var out corev1.ResourceList
	for name, q := range list {
		if domain, _, ok := strings.Cut(string(name), "/"); !ok || domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
			continue
		}
		if out == nil {
			out = corev1.ResourceList{}
		}
		out[name] = q
	}
	return out
}
