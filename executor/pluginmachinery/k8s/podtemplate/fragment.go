package podtemplate

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What an action's inline fragment may do, beside the Pod Security level: it is written
// by whoever may create a TaskAction, and it lands in a pod with the platform's template
// and the executor's own volumes. It only adds (docs/security.md, "What an inline pod
// template may change"):
//
//   - it sets only the top-level PodSpec fields Config.InlinePodTemplateFields lists;
//   - it references no Secret: Secrets reach a task only through spec.secrets, which
//     the admission policy checks against its author's rights;
//   - it names no container, init container or volume of the template's or the
//     executor's, bar the task's container ("default" or the task's name), and no volume
//     whose name begins with ReservedPrefix;
//   - its containers mount only volumes it defines;
//   - it changes no value the template sets (labels and annotations too);
//   - what it touches, as merged with the template, is held to the level.

// ReservedPrefix begins the names of the volumes the executor adds to a task's pod
// (the file storage mounts flyte-inputs and flyte-outputs, spec.secrets' flyte-secret-N):
// a fragment may not name such a volume, even one this pod lacks.
const ReservedPrefix = "flyte-"

// FieldsSetting is the executor's setting that lists the fields a fragment may set,
// named in refusals so that an author knows whom to ask.
const FieldsSetting = "k8s.inlinePodTemplateFields"

// checkFields refuses a fragment that sets a top-level field the platform does not
// list. A field set to null counts: the author asked for it.
func (s Source) checkFields(raw []byte) error {
	if len(raw) == 0 {
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return &Error{Code: CodeInvalid, Err: fmt.Errorf("spec.podTemplate.spec: %w", err)}
	}
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(s.Config.InlinePodTemplateFields, f) {
			return &Error{Code: CodeRefused, Err: fmt.Errorf(
				"spec.podTemplate.spec.%s: an inline pod template may not set %s: the executor's %s does not list it", f, f, FieldsSetting)}
		}
	}
	return nil
}

// checkSecrets refuses a fragment that references a Secret anywhere: any field whose
// name speaks of one (a volume's secret, a projected source's, secretRef and the
// *SecretRef of CSI and other volumes, secretName, envFrom's secretRef, secretKeyRef),
// found by walking the decoded fragment, so that a volume type added to Kubernetes
// later is covered too. imagePullSecrets is left to the list of fields.
func checkSecrets(spec *corev1.PodSpec) error {
	doc, err := generic(spec)
	if err != nil {
		return err
	}
	top, _ := doc.(map[string]any)
	delete(top, "imagePullSecrets")
	var found string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(v)) {
				p := k
				if path != "" {
					p = path + "." + k
				}
				if found == "" && strings.Contains(strings.ToLower(k), "secret") {
					found = p
				}
				walk(p, v[k])
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	walk("", top)
	if found != "" {
		return &Error{Code: CodeRefused, Err: fmt.Errorf(
			"spec.podTemplate.spec.%s references a Secret: Secrets reach a task only through spec.secrets", found)}
	}
	return nil
}

// LayInline lays inline, the action's fragment (from Inline), over base, the template
// (nil for none), refusing a fragment that would take over what the template or the
// executor put in the pod; pod is the pod the plugin built, whose volumes and
// containers are the executor's.
func (s Source) LayInline(base, inline *corev1.PodTemplateSpec, pod *corev1.Pod, task string) (*corev1.PodTemplateSpec, error) {
	if inline == nil {
		return Merge(base, nil, task)
	}
	if base == nil {
		base = &corev1.PodTemplateSpec{}
	}
	b, err := fold(base, task)
	if err != nil {
		return nil, err
	}
	o, err := fold(inline, task)
	if err != nil {
		return nil, err
	}
	if err := checkNames(&b.Spec, &o.Spec, pod, task); err != nil {
		return nil, err
	}
	if err := checkMounts(&o.Spec); err != nil {
		return nil, err
	}
	merged, err := Merge(base, inline, task)
	if err != nil {
		return nil, err
	}
	if err := onlyAdds(base, merged, o.ObjectMeta, task); err != nil {
		return nil, err
	}
	touched, err := touchedAsMerged(o, merged)
	if err != nil {
		return nil, err
	}
	if err := s.holdTo(touched, "spec.podTemplate, laid over the pod template,"); err != nil {
		return nil, err
	}
	return merged, nil
}

// checkNames refuses a fragment that names a container or volume the template or the
// executor has, other than the task's container: a strategic merge would lay the
// fragment over it, keeping what made it the platform's (a privileged init container,
// a hostPath volume) and taking what the fragment gives it (an image, a command).
func checkNames(base, over *corev1.PodSpec, pod *corev1.Pod, task string) error {
	theirs := map[string]bool{}
	for _, spec := range []*corev1.PodSpec{base, &pod.Spec} {
		for _, list := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
			for _, c := range list {
				theirs[c.Name] = c.Name != task
			}
		}
		for _, c := range spec.EphemeralContainers {
			theirs[c.Name] = true
		}
	}
	for _, field := range []string{"containers", "initContainers"} {
		for _, c := range containers(over, field) {
			// The task's container is a regular one: an init container of its name
			// would take the name of the executor's.
			if theirs[c.Name] || field == "initContainers" && (c.Name == task || c.Name == DefaultContainer) {
				return &Error{Code: CodeRefused, Err: fmt.Errorf("spec.podTemplate.spec.%s[%s]: the pod template or the executor has a container %q: "+
					"an inline pod template may add containers of its own, not change the template's", field, c.Name, c.Name)}
			}
		}
	}
	for _, v := range over.Volumes {
		if strings.HasPrefix(v.Name, ReservedPrefix) || slices.ContainsFunc(pod.Spec.Volumes, func(p corev1.Volume) bool { return p.Name == v.Name }) {
			return &Error{Code: CodeRefused, Err: fmt.Errorf("spec.podTemplate.spec.volumes[%s]: names beginning with %q are reserved for the executor's own volumes "+
				"(file storage, spec.secrets)", v.Name, ReservedPrefix)}
		}
		if slices.ContainsFunc(base.Volumes, func(b corev1.Volume) bool { return b.Name == v.Name }) {
			return &Error{Code: CodeRefused, Err: fmt.Errorf("spec.podTemplate.spec.volumes[%s]: the pod template has a volume %q: "+
				"an inline pod template may add volumes of its own, not change the template's", v.Name, v.Name)}
		}
	}
	return nil
}

// checkMounts refuses a container of the fragment that mounts a volume the fragment
// does not define: the template's (a hostPath one, say) or the executor's (the staged
// inputs, writable; a Secret volume). What the template's own container mounts reaches
// the task's container through the merge already.
func checkMounts(over *corev1.PodSpec) error {
	own := map[string]bool{}
	for _, v := range over.Volumes {
		own[v.Name] = true
	}
	for _, field := range []string{"containers", "initContainers"} {
		for _, c := range containers(over, field) {
			names := make([]string, 0, len(c.VolumeMounts)+len(c.VolumeDevices))
			for _, m := range c.VolumeMounts {
				names = append(names, m.Name)
			}
			for _, d := range c.VolumeDevices {
				names = append(names, d.Name)
			}
			for _, n := range names {
				if !own[n] {
					return &Error{Code: CodeRefused, Err: fmt.Errorf("spec.podTemplate.spec.%s[%s]: mounts the volume %q, which the fragment does not define: "+
						"an inline pod template mounts only volumes it defines", field, c.Name, n)}
				}
			}
		}
	}
	return nil
}

// onlyAdds refuses a fragment that changes a value the template sets: laying the
// template again over the merged result must change nothing. meta is the fragment's.
func onlyAdds(base, merged *corev1.PodTemplateSpec, meta metav1.ObjectMeta, task string) error {
	for _, m := range []struct {
		what       string
		over, base map[string]string
	}{{"label", meta.Labels, base.Labels}, {"annotation", meta.Annotations, base.Annotations}} {
		for _, k := range slices.Sorted(maps.Keys(m.over)) {
			if v, ok := m.base[k]; ok && v != m.over[k] {
				return &Error{Code: CodeRefused, Err: fmt.Errorf("spec.podTemplate.metadata: changes the %s %s, which the pod template sets: "+
					"an inline pod template may add to the template, not change it", m.what, k)}
			}
		}
	}
	again, err := Merge(merged, &corev1.PodTemplateSpec{Spec: base.Spec}, task)
	if err != nil {
		return err
	}
	was, err := generic(&merged.Spec)
	if err != nil {
		return err
	}
	is, err := generic(&again.Spec)
	if err != nil {
		return err
	}
	if path, ok := firstDifference("", was, is); ok {
		return &Error{Code: CodeRefused, Err: fmt.Errorf("spec.podTemplate.spec: changes %s, which the pod template sets "+
			"(containers[%s] is the task's): an inline pod template may add to the template, not change it", path, task)}
	}
	return nil
}

// firstDifference is the path of the first place where a and b, decoded JSON, differ.
// List items are named by their name (or mount path) where they have one.
func firstDifference(path string, a, b any) (string, bool) {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok {
			return path, true
		}
		// Sorted, so that of several differences the same is named each time.
		keys := slices.Sorted(maps.Keys(a))
		for _, k := range slices.Sorted(maps.Keys(bm)) {
			if _, ok := a[k]; !ok {
				keys = append(keys, k)
			}
		}
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			if d, ok := firstDifference(p, a[k], bm[k]); ok {
				return d, true
			}
		}
		return "", false
	case []any:
		bl, ok := b.([]any)
		if !ok || len(a) != len(bl) {
			return path, true
		}
		for i := range a {
			if d, ok := firstDifference(fmt.Sprintf("%s[%s]", path, itemName(path, a[i], i)), a[i], bl[i]); ok {
				return d, true
			}
		}
		return "", false
	default:
		return path, !reflect.DeepEqual(a, b)
	}
}

// itemName names an item of the list at path by its merge key, else its index.
func itemName(path string, item any, i int) string {
	key := "name"
	switch {
	case strings.HasSuffix(path, "volumeMounts"):
		key = "mountPath"
	case strings.HasSuffix(path, "volumeDevices"):
		key = "devicePath"
	}
	if m, ok := item.(map[string]any); ok {
		if s, ok := m[key].(string); ok {
			return s
		}
	}
	return fmt.Sprint(i)
}

// touchedAsMerged is what the fragment over (folded) touches of merged: the top-level
// fields it sets, its containers and init containers, with their values as merged (the
// task's container with the template's), and its volumes; with its own metadata. Pod
// Security judges this, so that a fragment cannot lean on the template's privilege.
func touchedAsMerged(over, merged *corev1.PodTemplateSpec) (*corev1.PodTemplateSpec, error) {
	o, err := generic(&over.Spec)
	if err != nil {
		return nil, err
	}
	m, err := generic(&merged.Spec)
	if err != nil {
		return nil, err
	}
	overFields, _ := o.(map[string]any)
	mergedFields, _ := m.(map[string]any)
	fields := map[string]any{}
	for k, v := range overFields {
		switch {
		case v == nil:
		case k == "containers" || k == "initContainers" || k == "ephemeralContainers" || k == "volumes":
		default:
			fields[k] = mergedFields[k]
		}
	}
	raw, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	out := &corev1.PodTemplateSpec{ObjectMeta: *over.ObjectMeta.DeepCopy()}
	if err := json.Unmarshal(raw, &out.Spec); err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	pick := func(theirs, mine []corev1.Container) []corev1.Container {
		var out []corev1.Container
		for _, c := range mine {
			if i := slices.IndexFunc(theirs, func(t corev1.Container) bool { return t.Name == c.Name }); i >= 0 {
				out = append(out, theirs[i])
			}
		}
		return out
	}
	out.Spec.Containers = pick(merged.Spec.Containers, over.Spec.Containers)
	out.Spec.InitContainers = pick(merged.Spec.InitContainers, over.Spec.InitContainers)
	out.Spec.Volumes = over.Spec.Volumes
	return out, nil
}

// containers is spec's list named field: "containers" or "initContainers".
func containers(spec *corev1.PodSpec, field string) []corev1.Container {
	if field == "initContainers" {
		return spec.InitContainers
	}
	return spec.Containers
}

// generic is spec as decoded JSON.
func generic(spec *corev1.PodSpec) (any, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	return doc, nil
}
