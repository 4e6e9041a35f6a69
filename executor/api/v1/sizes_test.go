package v1_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// containerSample is the sample, with a container, as the API server receives it: sizes
// tests write fields as text (a quantity of 64 digits) that typed fields would rewrite.
func containerSample(t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	ta := sample(t, ns)
	ta.Name = name
	ta.Spec.Container = &flytev1.ContainerSpec{Image: "busybox"}
	ta.Spec.Config = nil // its value would count in the spec's text
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ta)
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: raw}
	obj.SetAPIVersion(flytev1.GroupVersion.String())
	obj.SetKind("TaskAction")
	return obj
}

// set puts value at path in obj, making the maps on the way.
func set(t *testing.T, obj *unstructured.Unstructured, value any, path ...string) {
	t.Helper()
	if err := unstructured.SetNestedField(obj.Object, value, path...); err != nil {
		t.Fatalf("setting %s: %v", strings.Join(path, "."), err)
	}
}

// chunks splits n characters into strings of at most size each.
func chunks(n, size int) []any {
	var out []any
	for n > 0 {
		c := min(n, size)
		out = append(out, strings.Repeat("x", c))
		n -= c
	}
	return out
}

// items is n strings made by item.
func items(n int, item func(i int) any) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = item(i)
	}
	return out
}

// entries is a map of n entries, keyed k0, k1, ..., each value made by value.
func entries(n int, value func(i int) any) map[string]any {
	out := make(map[string]any, n)
	for i := range n {
		out["k"+strconv.Itoa(i)] = value(i)
	}
	return out
}

func text(n int) string { return strings.Repeat("x", n) }

// textMap is a map whose keys (one letter each) and values of at most size characters
// have n characters together.
func textMap(n, size int) map[string]any {
	out := map[string]any{}
	for key := 'a'; n > 0; key++ {
		v := min(n-1, size)
		out[string(key)] = text(v)
		n -= 1 + v
	}
	return out
}

// TestOversizedArgsAreRefused: the finding itself. One argument of 1.3 MB was admitted,
// and two hundred such actions took the executor to a GiB; the API server now refuses it
// and says what the limit is.
func TestOversizedArgsAreRefused(t *testing.T) {
	obj := containerSample(t, env.Namespace(t), "big-args")
	set(t, obj, []any{text(1300 << 10)}, "spec", "container", "args")
	err := env.Client.Create(ctx(t), obj)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.container.args[0]") ||
		!strings.Contains(err.Error(), strconv.Itoa(flytev1.MaxArgLength)) {
		t.Fatalf("got %v; want Invalid naming spec.container.args[0] and %d", err, flytev1.MaxArgLength)
	}
}

// TestSpecSizeLimits: every field of the spec that can grow is bounded at admission,
// each at the limit of executor/api/v1/limits.go: a spec at the limit is admitted, one
// past it refused, with a message that names the field and the limit.
func TestSpecSizeLimits(t *testing.T) {
	ns := env.Namespace(t)
	container := func(p ...string) []string { return append([]string{"spec", "container"}, p...) }
	valueFrom := func(source, field string) func(*testing.T, *unstructured.Unstructured, int) {
		return func(t *testing.T, o *unstructured.Unstructured, n int) {
			ref := map[string]any{field: text(n)}
			for _, required := range map[string][]string{
				"secretKeyRef": {"name", "key"}, "configMapKeyRef": {"name", "key"},
				"fieldRef": {"fieldPath"}, "resourceFieldRef": {"resource"}, "fileKeyRef": {"key", "path", "volumeName"},
			}[source] {
				if required != field {
					ref[required] = "x"
				}
			}
			set(t, o, []any{map[string]any{"name": "V", "valueFrom": map[string]any{source: ref}}}, container("env")...)
		}
	}
	tests := []struct {
		name  string
		limit int
		fill  func(t *testing.T, o *unstructured.Unstructured, n int) // makes the field n long, or n items
		want  string                                                  // part of the refusal, with the limit
	}{
		{"timeout", flytev1.MaxTimeoutLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			// A duration may repeat its units: "1s0s0s" is a second.
			d := "1s" + strings.Repeat("0s", (n-2)/2)
			if n%2 == 1 {
				d = "1ns" + strings.Repeat("0s", (n-3)/2)
			}
			set(t, o, d, "spec", "timeout")
		}, "spec.timeout"},
		{"command items", flytev1.MaxArgs, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, items(n, func(int) any { return "x" }), container("command")...)
		}, "spec.container.command"},
		{"a command item", flytev1.MaxArgLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, []any{text(n)}, container("command")...)
		}, "spec.container.command[0]"},
		{"args items", flytev1.MaxArgs, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, items(n, func(int) any { return "x" }), container("args")...)
		}, "spec.container.args"},
		{"an args item", flytev1.MaxArgLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, []any{text(n)}, container("args")...)
		}, "spec.container.args[0]"},
		{"command and args together", flytev1.MaxCommandLineLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, []any{"sh"}, container("command")...)
			set(t, o, chunks(n-2, flytev1.MaxArgLength), container("args")...)
		}, "command and args are at most"},
		{"env items", flytev1.MaxEnv, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, items(n, func(i int) any { return map[string]any{"name": fmt.Sprintf("V%d", i)} }), container("env")...)
		}, "spec.container.env"},
		{"an env name", flytev1.MaxEnvNameLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, []any{map[string]any{"name": text(n)}}, container("env")...)
		}, "env names are at most"},
		{"an env value", flytev1.MaxValueLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, []any{map[string]any{"name": "V", "value": text(n)}}, container("env")...)
		}, "env values are at most"},
		{"a secretKeyRef's name", flytev1.MaxReferenceLength, valueFrom("secretKeyRef", "name"), "the names in valueFrom are at most"},
		{"a secretKeyRef's key", flytev1.MaxReferenceLength, valueFrom("secretKeyRef", "key"), "the names in valueFrom are at most"},
		{"a configMapKeyRef's key", flytev1.MaxReferenceLength, valueFrom("configMapKeyRef", "key"), "the names in valueFrom are at most"},
		{"a fieldRef's fieldPath", flytev1.MaxReferenceLength, valueFrom("fieldRef", "fieldPath"), "the names in valueFrom are at most"},
		{"a resourceFieldRef's resource", flytev1.MaxReferenceLength, valueFrom("resourceFieldRef", "resource"), "the names in valueFrom are at most"},
		{"a fileKeyRef's path", flytev1.MaxReferenceLength, valueFrom("fileKeyRef", "path"), "the names in valueFrom are at most"},
		{"envVars entries", flytev1.MaxEnvVars, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, entries(n, func(int) any { return "v" }), "spec", "envVars")
		}, "spec.envVars"},
		{"an envVars name", flytev1.MaxEnvNameLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{text(n): "v"}, "spec", "envVars")
		}, "envVars names are at most"},
		{"an envVars value", flytev1.MaxValueLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{"V": text(n)}, "spec", "envVars")
		}, "envVars values are at most"},
		{"config entries", flytev1.MaxConfig, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, entries(n, func(int) any { return "v" }), "spec", "config")
		}, "spec.config"},
		{"a config key", flytev1.MaxKeyLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{text(n): "v"}, "spec", "config")
		}, "config keys are at most"},
		{"a config value", flytev1.MaxValueLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{"other": text(n)}, "spec", "config")
		}, "config values are at most"},
		{"secrets", flytev1.MaxSecrets, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, items(n, func(i int) any { return map[string]any{"name": "db", "mountPath": fmt.Sprintf("/etc/s%d", i)} }), "spec", "secrets")
		}, "spec.secrets"},
		{"ignoredInputs items", flytev1.MaxIgnoredInputs, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, items(n, func(i int) any { return fmt.Sprintf("in%d", i) }), "spec", "cache", "ignoredInputs")
		}, "spec.cache.ignoredInputs"},
		{"an ignoredInputs item", flytev1.MaxIgnoredInputLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, []any{text(n)}, "spec", "cache", "ignoredInputs")
		}, "spec.cache.ignoredInputs[0]"},
		{"resource limits", flytev1.MaxResourceNames, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, entries(n, func(int) any { return "1" }), container("resources", "limits")...)
		}, "resources' limits and requests name at most"},
		{"resource requests", flytev1.MaxResourceNames, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, entries(n, func(int) any { return "1" }), container("resources", "requests")...)
		}, "resources' limits and requests name at most"},
		{"a resource name", flytev1.MaxResourceNameLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{text(n): "1"}, container("resources", "requests")...)
		}, "resource names are at most"},
		{"a quantity", flytev1.MaxQuantityLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{"cpu": strings.Repeat("1", n)}, container("resources", "limits")...)
		}, "quantities are at most"},
		{"resource claims", flytev1.MaxResourceClaims, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, items(n, func(i int) any { return map[string]any{"name": fmt.Sprintf("c%d", i)} }), container("resources", "claims")...)
		}, "resources' claims are at most"},
		{"a resource claim's name", flytev1.MaxReferenceLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, []any{map[string]any{"name": text(n)}}, container("resources", "claims")...)
		}, "claim names are at most"},
		{"pod labels", flytev1.MaxPodLabels, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, entries(n, func(int) any { return "v" }), "spec", "podTemplate", "metadata", "labels")
		}, "spec.podTemplate.metadata.labels"},
		{"a pod label's key", flytev1.MaxKeyLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{text(n): "v"}, "spec", "podTemplate", "metadata", "labels")
		}, "label keys are at most"},
		{"a pod label's value", flytev1.MaxLabelValueLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{"team": text(n)}, "spec", "podTemplate", "metadata", "labels")
		}, "label values are at most"},
		{"pod annotations", flytev1.MaxPodAnnotations, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, entries(n, func(int) any { return "v" }), "spec", "podTemplate", "metadata", "annotations")
		}, "spec.podTemplate.metadata.annotations"},
		{"a pod annotation's key", flytev1.MaxKeyLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{text(n): "v"}, "spec", "podTemplate", "metadata", "annotations")
		}, "annotation keys are at most"},
		{"a pod annotation's value", flytev1.MaxValueLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, map[string]any{"note": text(n)}, "spec", "podTemplate", "metadata", "annotations")
		}, "annotation values are at most"},
		// The whole spec: the long texts of every kind count together.
		{"the spec's text, in envVars", flytev1.MaxSpecTextLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			set(t, o, textMap(n, flytev1.MaxValueLength), "spec", "envVars")
		}, "the spec's texts are at most"},
		{"the spec's text, in every kind", flytev1.MaxSpecTextLength, func(t *testing.T, o *unstructured.Unstructured, n int) {
			// Each kind gets a part; what is left goes in annotations.
			part := flytev1.MaxValueLength
			set(t, o, []any{text(part)}, container("command")...)
			set(t, o, []any{text(part)}, container("args")...)
			set(t, o, []any{map[string]any{"name": "V", "value": text(part - 1)}}, container("env")...)
			set(t, o, map[string]any{"V": text(part - 1)}, "spec", "envVars")
			set(t, o, map[string]any{"o": text(part - 1)}, "spec", "config")
			set(t, o, []any{map[string]any{"name": "db", "mountPath": "/" + strings.Repeat("m", 4095)}}, "spec", "secrets")
			set(t, o, textMap(n-5*part-4096, flytev1.MaxValueLength), "spec", "podTemplate", "metadata", "annotations")
		}, "the spec's texts are at most"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := containerSample(t, ns, fmt.Sprintf("at-%d", i))
			tt.fill(t, at, tt.limit)
			if err := env.Client.Create(ctx(t), at); err != nil {
				t.Fatalf("at the limit (%d): %v", tt.limit, err)
			}
			past := containerSample(t, ns, fmt.Sprintf("past-%d", i))
			tt.fill(t, past, tt.limit+1)
			err := env.Client.Create(ctx(t), past)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), strconv.Itoa(tt.limit)) {
				t.Fatalf("past the limit (%d): %v; want Invalid mentioning %q and %d", tt.limit+1, err, tt.want, tt.limit)
			}
		})
	}
}

// TestEnvValueFromHasOneSource: an env variable's valueFrom with several sources, which
// Kubernetes refuses when the pod is made, is refused at admission; it would otherwise
// count several sources' names against the spec's size.
func TestEnvValueFromHasOneSource(t *testing.T) {
	ns := env.Namespace(t)
	one := containerSample(t, ns, "one-source")
	set(t, one, []any{map[string]any{"name": "V", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "db", "key": "k"}}}}, "spec", "container", "env")
	if err := env.Client.Create(ctx(t), one); err != nil {
		t.Fatalf("one source: %v", err)
	}
	two := containerSample(t, ns, "two-sources")
	set(t, two, []any{map[string]any{"name": "V", "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "db", "key": "k"},
		"fieldRef": map[string]any{"fieldPath": "metadata.name"}}}}, "spec", "container", "env")
	if err := env.Client.Create(ctx(t), two); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "valueFrom has one source") {
		t.Fatalf("two sources: %v; want Invalid: valueFrom has one source", err)
	}
}
