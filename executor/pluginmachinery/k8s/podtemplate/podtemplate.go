// Package podtemplate shapes a task's pod with PodTemplates, as Flyte does: the
// cluster's default (or the one the action names) is the base, the action's inline
// fragment goes over it, only adding (LayInline), and the pod the plugin built from the
// action goes over both.
// Lists with a key (containers, env, volumes, volume mounts) merge by it, as a strategic
// merge patch does; tolerations, which have no key, are joined.
package podtemplate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kjson "sigs.k8s.io/json"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// Label marks the PodTemplates the executor may use; its informer holds only these, so
// its memory does not grow with the cluster's templates, and a template made for
// something else is never applied to a task.
const Label = "flyte.org/pod-template"

// DefaultContainer is the name of a template's container that applies to the task's
// container, whatever its name.
const DefaultContainer = "default"

// Codes of the user errors a template gives.
const (
	CodeNotFound = "PodTemplateNotFound"
	CodeInvalid  = "BadPodTemplate"
	CodeRefused  = "PodTemplateRefused"
)

// MaxInlineBytes bounds an action's inline fragment.
const MaxInlineBytes = 64 << 10

// Levels of Pod Security an action's inline fragment is held to.
const (
	// LevelBaseline refuses what Pod Security's baseline level forbids.
	LevelBaseline = string(psaapi.LevelBaseline)
	// LevelPrivileged refuses nothing: for clusters where whoever may create a
	// TaskAction may also create any pod.
	LevelPrivileged = string(psaapi.LevelPrivileged)
)

// Error is a template the action cannot run with: its Code says why.
type Error struct {
	Code string
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Config says where templates come from. k8s.Config embeds it, so its json names are
// keys of the executor's configuration section k8s (docs/configuration.md), and its
// fields are named after them.
type Config struct {
	// DefaultPodTemplateName names the PodTemplate every Kubernetes task's pods start
	// from, unless the action names another (spec.podTemplateName): looked up in the
	// action's namespace, then in ExecutorNamespace, among PodTemplates labelled with
	// Label (the only ones the executor reads). A missing default is not an error.
	// Default empty: none.
	DefaultPodTemplateName string `json:"defaultPodTemplateName,omitempty"`
	// ExecutorNamespace is looked in after the action's own namespace; empty for none.
	// It is no key of the section: the executor fills it in from its own namespace.
	ExecutorNamespace string `json:"-"`
	// InlinePodTemplateLevel is the Pod Security level an action's own
	// spec.podTemplate is held to: LevelBaseline (also when empty) refuses host
	// namespaces, privileged containers, hostPath volumes and added capabilities, since
	// whoever may create a TaskAction then gets pods the executor creates;
	// LevelPrivileged refuses nothing, for clusters where that is everyone who may
	// create pods anyway. The cluster's own Pod Security admission still applies to
	// every pod. Default "baseline".
	InlinePodTemplateLevel string `json:"inlinePodTemplateLevel"`
	// InlinePodTemplateFields lists the top-level PodSpec fields (by their JSON names)
	// an action's spec.podTemplate may set; any other is refused (CodeRefused), and nil
	// allows none. Placement, priority and identity are the platform's: whoever may
	// create a TaskAction may not thereby pick a node, tolerate a taint, pre-empt others
	// or run as another ServiceAccount, so the default leaves out nodeName, affinity,
	// tolerations, schedulerName, priorityClassName, priority, preemptionPolicy,
	// topologySpreadConstraints, runtimeClassName, serviceAccountName, serviceAccount,
	// automountServiceAccountToken, hostAliases, shareProcessNamespace (the template's
	// sidecars' processes) and imagePullSecrets (Secrets reach a task only through
	// spec.secrets). nodeSelector is in: it only narrows where the scheduler may put
	// the pod (taints, quotas and the template's own selector still hold), and GPU
	// tasks commonly need it. Setting the list replaces the default
	// (config.DefaultInlinePodTemplateFields).
	InlinePodTemplateFields []string `json:"inlinePodTemplateFields"`
}

// Source finds templates.
type Source struct {
	Config Config
	// Reader reads PodTemplates, from the executor's label-filtered informer.
	Reader client.Reader
}

// Base returns the template an action's pods start from: the one it names, else the
// default, looked up in its namespace and then in the executor's; nil when there is
// none. A template the action names that cannot be found is an *Error. What the API
// server filled in when it stored the template is cleared (withoutServerDefaults).
func (s Source) Base(ctx context.Context, action *flytev1.TaskAction) (*corev1.PodTemplateSpec, error) {
	name, named := action.Spec.PodTemplateName, true
	if name == "" {
		name, named = s.Config.DefaultPodTemplateName, false
	}
	if name == "" || s.Reader == nil {
		if named {
			return nil, &Error{Code: CodeNotFound, Err: fmt.Errorf("spec.podTemplateName %q: the executor reads no PodTemplates", name)}
		}
		return nil, nil
	}
	namespaces := []string{action.Namespace}
	if ns := s.Config.ExecutorNamespace; ns != "" && ns != action.Namespace {
		namespaces = append(namespaces, ns)
	}
	for _, ns := range namespaces {
		var t corev1.PodTemplate
		err := s.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &t)
		switch {
		case err == nil:
			withoutServerDefaults(&t.Template.Spec)
			return &t.Template, nil
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("reading PodTemplate %s/%s: %w", ns, name, err)
		}
	}
	if !named {
		return nil, nil
	}
	return nil, &Error{Code: CodeNotFound, Err: fmt.Errorf(
		"spec.podTemplateName: no PodTemplate %q labelled %s in namespace %s", name, Label, strings.Join(namespaces, " or "))}
}

// Inline decodes an action's inline fragment, strictly, and holds it to the configured
// Pod Security level; nil when the action has none.
func (s Source) Inline(action *flytev1.TaskAction) (*corev1.PodTemplateSpec, error) {
	t := action.Spec.PodTemplate
	if t == nil {
		return nil, nil
	}
	out := &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
		Labels: maps.Clone(t.Metadata.Labels), Annotations: maps.Clone(t.Metadata.Annotations)}}
	if raw := t.Spec.Raw; len(raw) > 0 {
		if len(raw) > MaxInlineBytes {
			// Not its size: the executor's cache keeps only this much more of it.
			return nil, &Error{Code: CodeInvalid, Err: fmt.Errorf("spec.podTemplate.spec is more than %d bytes", MaxInlineBytes)}
		}
		strict, err := kjson.UnmarshalStrict(raw, &out.Spec)
		if err = errors.Join(append([]error{err}, strict...)...); err != nil {
			return nil, &Error{Code: CodeInvalid, Err: fmt.Errorf("spec.podTemplate.spec: %w", err)}
		}
		if err := s.checkFields(raw); err != nil {
			return nil, err
		}
	}
	if err := checkSecrets(&out.Spec); err != nil {
		return nil, err
	}
	if err := s.holdTo(out, "spec.podTemplate"); err != nil {
		return nil, err
	}
	return out, nil
}

// evaluator applies Pod Security's checks.
var evaluator = func() policy.Evaluator {
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		panic(fmt.Sprintf("podtemplate: Pod Security's own checks: %v", err)) // a bug in the library's tables
	}
	return e
}()

// holdTo refuses t, what (a part of) a fragment asks for, if the configured level
// forbids it. Baseline forbids, it requires nothing, so only what t holds is judged.
func (s Source) holdTo(t *corev1.PodTemplateSpec, what string) error {
	level := s.Config.InlinePodTemplateLevel
	if level == "" {
		level = LevelBaseline
	}
	lvl, err := psaapi.ParseLevel(level)
	if err != nil {
		return fmt.Errorf("podtemplate: %w", err)
	}
	if lvl == psaapi.LevelPrivileged {
		return nil
	}
	agg := policy.AggregateCheckResults(evaluator.EvaluatePod(psaapi.LevelVersion{Level: lvl, Version: psaapi.LatestVersion()}, &t.ObjectMeta, &t.Spec))
	if agg.Allowed {
		return nil
	}
	return &Error{Code: CodeRefused, Err: fmt.Errorf("%s asks for what Pod Security's %s level forbids: %s (%s)",
		what, lvl, agg.ForbiddenReason(), agg.ForbiddenDetail())}
}

// Merge lays over on base: labels, annotations and fields over sets win, lists with a
// key merge by it, tolerations are joined. Each side's container named DefaultContainer
// is folded into its container named task first. Either may be nil.
func Merge(base, over *corev1.PodTemplateSpec, task string) (*corev1.PodTemplateSpec, error) {
	switch {
	case base == nil && over == nil:
		return nil, nil
	case base == nil:
		return fold(over, task)
	case over == nil:
		return fold(base, task)
	}
	b, err := fold(base, task)
	if err != nil {
		return nil, err
	}
	o, err := fold(over, task)
	if err != nil {
		return nil, err
	}
	spec, err := mergeSpecs(&b.Spec, &o.Spec)
	if err != nil {
		return nil, err
	}
	return &corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: union(b.Labels, o.Labels), Annotations: union(b.Annotations, o.Annotations)},
		Spec:       *spec,
	}, nil
}

// Apply lays pod, as the plugin built it, over the template t (nil for none), and puts
// the task's container first, where the plugin built it.
func Apply(t *corev1.PodTemplateSpec, pod *corev1.Pod, task string) error {
	if t == nil {
		return nil
	}
	t, err := fold(t, task)
	if err != nil {
		return err
	}
	spec, err := mergeSpecs(&t.Spec, &pod.Spec)
	if err != nil {
		return err
	}
	slices.SortStableFunc(spec.Containers, func(a, b corev1.Container) int {
		switch {
		case a.Name == task && b.Name != task:
			return -1
		case b.Name == task && a.Name != task:
			return 1
		}
		return 0
	})
	pod.Spec = *spec
	pod.Labels = union(t.Labels, pod.Labels)
	pod.Annotations = union(t.Annotations, pod.Annotations)
	return nil
}

// fold returns t with its DefaultContainer merged under its container named task (and
// renamed so), leaving t as it was.
func fold(t *corev1.PodTemplateSpec, task string) (*corev1.PodTemplateSpec, error) {
	t = t.DeepCopy()
	i := slices.IndexFunc(t.Spec.Containers, func(c corev1.Container) bool { return c.Name == DefaultContainer })
	if i < 0 || task == DefaultContainer {
		return t, nil
	}
	def := t.Spec.Containers[i]
	t.Spec.Containers = slices.Delete(t.Spec.Containers, i, i+1)
	def.Name = task
	j := slices.IndexFunc(t.Spec.Containers, func(c corev1.Container) bool { return c.Name == task })
	if j < 0 {
		t.Spec.Containers = append([]corev1.Container{def}, t.Spec.Containers...)
		return t, nil
	}
	merged, err := mergeSpecs(&corev1.PodSpec{Containers: []corev1.Container{def}},
		&corev1.PodSpec{Containers: []corev1.Container{t.Spec.Containers[j]}})
	if err != nil {
		return nil, err
	}
	t.Spec.Containers[j] = merged.Containers[0]
	return t, nil
}

// mergeSpecs lays over on base as a strategic merge patch would, but joins tolerations,
// which such a patch replaces.
func mergeSpecs(base, over *corev1.PodSpec) (*corev1.PodSpec, error) {
	b, err := json.Marshal(base)
	if err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	o, err := asPatch(over)
	if err != nil {
		return nil, err
	}
	raw, err := strategicpatch.StrategicMergePatch(b, o, corev1.PodSpec{})
	if err != nil {
		return nil, &Error{Code: CodeInvalid, Err: fmt.Errorf("merging the pod template: %w", err)}
	}
	var out corev1.PodSpec
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	out.Tolerations = slices.Clone(base.Tolerations)
	for _, t := range over.Tolerations {
		if !slices.ContainsFunc(out.Tolerations, func(have corev1.Toleration) bool { return have.MatchToleration(&t) }) {
			out.Tolerations = append(out.Tolerations, t)
		}
	}
	return &out, nil
}

// asPatch is over as a strategic merge patch that only lays what over sets on its base.
// A typed PodSpec marshals a field without omitempty (containers) as null, which a patch
// reads as "delete", so nulls are dropped; and a patch's directives ($patch, $retainKeys)
// can only come as the key of a map (a node selector's, say), where they would delete
// what the base holds, so such keys are refused.
func asPatch(over *corev1.PodSpec) ([]byte, error) {
	raw, err := json.Marshal(over)
	if err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("podtemplate: %w", err)
	}
	var directive string
	var prune func(any) any
	prune = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if strings.HasPrefix(k, "$") && directive == "" {
					directive = k
				}
				if e == nil {
					delete(v, k)
					continue
				}
				v[k] = prune(e)
			}
		case []any:
			for i, e := range v {
				v[i] = prune(e)
			}
		}
		return v
	}
	doc = prune(doc)
	if directive != "" {
		return nil, &Error{Code: CodeInvalid, Err: fmt.Errorf("the pod template holds the key %q: keys may not start with '$'", directive)}
	}
	return json.Marshal(doc)
}

// union is a's entries overwritten by b's; nil when both are empty.
func union(a, b map[string]string) map[string]string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}
