package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// The hostile tenant: namespace hostile, whose project is hostile by its name (no
// project label), runs beside the chaos tenant and tries to reach it or to take the
// executor down. Each of its actions must fail, alone, with the error that names what
// it tried; the chaos tenant's actions must finish as planned all the same.
const (
	hostileNamespace = "hostile"
	hostileProject   = "hostile"
)

// Kinds of hostile action.
const (
	// An action in hostile naming project chaos, run soak and a chaos action's name,
	// with that action's input and output base: run, it would read the victim's input,
	// write in the victim's store and report events over the victim's history.
	kindForgeEcho = "forge-echo"
	// As forge-echo, but echoing a marked input of hostile's own into the victim's
	// output base: run, the mark would show in the chaos tenant's files.
	kindForgeWrite = "forge-write"
	// A cacheable action naming project chaos and a chaos cached group's task, version
	// and inputs, with outputs of its own, overwriting: run, the group's entry would
	// point at them.
	kindForgeCache = "forge-cache"
	// A container whose attempt leaves a sparse 64 GiB error.json.
	kindErrorDoc = "huge-error-doc"
	// A container whose attempt leaves more output entries than storage.maxOutputEntries.
	kindOutputTree = "wide-output-tree"
	// A container whose inline pod template redefines, by name, the privileged init
	// container of a platform PodTemplate.
	kindTakeover = "fragment-takeover"
)

var hostileKinds = []string{kindForgeEcho, kindForgeWrite, kindForgeCache, kindErrorDoc, kindOutputTree, kindTakeover}

// forged says a hostile kind names project chaos.
func forged(kind string) bool {
	return kind == kindForgeEcho || kind == kindForgeWrite || kind == kindForgeCache
}

// Bounds of the soak's executors that the hostile tenant meets.
const (
	// soakMaxOutputEntries is storage.maxOutputEntries of the soak's executors: small,
	// so that a tree over it costs a pod a thousand empty files, not the default ten
	// thousand.
	soakMaxOutputEntries = 1000
	// outputTreeFiles is how many files the wide tree holds.
	outputTreeFiles = soakMaxOutputEntries + 100
)

// takeoverTemplate is the platform PodTemplate the takeover aims at, in the hostile
// namespace, as a platform team would put it there for GPU tasks; takeoverInit is its
// privileged init container.
const (
	takeoverTemplate = "gpu-driver"
	takeoverInit     = "driver-setup"
)

// hostileMark is in every input of hostile's own; no file of the chaos tenant may hold it.
const hostileMark = `"hostile"`

// planHostile draws the hostile tenant's actions of a run of duration d from rnd,
// beside the chaos plans (victims are drawn from them): a handful a minute, every kind
// at least once, at random times. They are never deleted by the client.
func planHostile(rnd *rand.Rand, d time.Duration, chaos []*plan, dataDir, image string) ([]*plan, error) {
	n := max(int(d.Minutes()*6), len(hostileKinds))
	var out []*plan
	for i := range n {
		kind := hostileKinds[i%len(hostileKinds)]
		if i >= len(hostileKinds) {
			kind = hostileKinds[rnd.IntN(len(hostileKinds))]
		}
		p := &plan{kind: kind, hostile: true, at: time.Duration(rnd.Int64N(int64(d))), expect: flytev1.PhaseFailed}
		p.name = fmt.Sprintf("h%03d-%s", i, kind)
		spec := flytev1.TaskActionSpec{Project: hostileProject, Domain: "development", RunName: "hostile", ActionName: p.name,
			TaskName: "hostile." + kind, RunOutputBase: "file://" + filepath.ToSlash(filepath.Join(dataDir, "outputs", hostileNamespace, p.name))}
		own := filepath.Join(dataDir, "inputs", hostileNamespace+"-"+p.name+".json")
		if err := os.WriteFile(own, fmt.Appendf(nil, `{%s:%q}`, hostileMark, p.name), 0o644); err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
		spec.InputURI = "file://" + filepath.ToSlash(own)
		container := func(script string) {
			spec.TaskType = "container"
			// The same command on either node: on the real one the container does it, the
			// stand-in kubelet does what it says (systemtest.Kubelet, leave).
			spec.Container = &flytev1.ContainerSpec{Image: image, Command: []string{"sh", "-c", `out=${` + flytek8s.EnvOutputPrefix + `#file://}; ` + script}}
		}
		switch kind {
		case kindForgeEcho, kindForgeWrite:
			// The victim is of a kind that echoes nothing (forge-echo), so that an event
			// of task type core-echo under its name can only be the forger's; or an echo
			// (forge-write), whose files the mark would reach. Drawn among those created
			// before, and kept by the client, so that its history is all there to hold.
			want := func(k string) bool { return k != kindEcho && k != kindCachedEcho && k != kindCachedSleep }
			if kind == kindForgeWrite {
				want = func(k string) bool { return k == kindEcho }
			}
			v := victim(rnd, chaos, p.at, want)
			if v == nil {
				return nil, fmt.Errorf("workload: no chaos action for %s to forge", p.name)
			}
			p.victim = v.name
			spec.Project, spec.RunName, spec.ActionName = v.action.Spec.Project, v.action.Spec.RunName, v.action.Spec.ActionName
			spec.TaskType, spec.RunOutputBase = "core-echo", v.action.Spec.RunOutputBase
			if kind == kindForgeEcho {
				spec.InputURI = v.action.Spec.InputURI
			}
			p.code = flytev1.ReasonProjectNotOfNamespace
		case kindForgeCache:
			// The key of a chaos cached-echo group, the outputs its own; overwrite, so
			// that run, it would replace the group's entry rather than hit it.
			group := rnd.IntN(3)
			spec.Project, spec.RunName = "chaos", "soak"
			spec.TaskType, spec.TaskName = "core-echo", fmt.Sprintf("chaos.%s.group%d", kindCachedEcho, group)
			spec.Cache = &flytev1.CacheSpec{Enabled: true, Version: "1", Serializable: true, Overwrite: true}
			spec.InputURI = "file://" + filepath.ToSlash(filepath.Join(dataDir, "inputs", fmt.Sprintf("group-%d.json", group)))
			p.code = flytev1.ReasonProjectNotOfNamespace
		case kindErrorDoc:
			container(`truncate -s 64G $out/error.json`)
			p.code = flytek8s.CodeErrorDocumentTooLarge
		case kindOutputTree:
			container(fmt.Sprintf(`i=0; while [ $i -lt %d ]; do : > $out/f$i; i=$((i+1)); done`, outputTreeFiles))
			p.code = flytek8s.CodeOutputsTooLarge
		case kindTakeover:
			container(`true`)
			spec.PodTemplateName = takeoverTemplate
			spec.PodTemplate = &flytev1.PodTemplate{Spec: runtime.RawExtension{Raw: fmt.Appendf(nil,
				`{"initContainers":[{"name":%q,"image":%q,"command":["sh","-c","cat /dev/mem > /dev/null"]}]}`, takeoverInit, image)}}
			p.code = podtemplate.CodeRefused
		}
		p.action = &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: hostileNamespace}, Spec: spec}
		out = append(out, p)
	}
	return out, nil
}

// victim draws a chaos plan the client keeps, of a kind want accepts, planned before at
// (else any such plan).
func victim(rnd *rand.Rand, chaos []*plan, at time.Duration, want func(string) bool) *plan {
	var before, any []*plan
	for _, p := range chaos {
		if p.deletion != keep || !want(p.kind) {
			continue
		}
		any = append(any, p)
		if p.at < at {
			before = append(before, p)
		}
	}
	if len(before) > 0 {
		return before[rnd.IntN(len(before))]
	}
	if len(any) > 0 {
		return any[rnd.IntN(len(any))]
	}
	return nil
}

// setUpHostile makes the hostile namespace and the platform PodTemplate the takeover
// aims at: a privileged init container with the node's /run/nvidia mounted.
func setUpHostile(ctx context.Context, c client.Client, image string) error {
	hostDir := corev1.HostPathDirectoryOrCreate
	tmpl := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: takeoverTemplate, Namespace: hostileNamespace, Labels: map[string]string{podtemplate.Label: "true"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{{Name: "nvidia-driver", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/nvidia", Type: &hostDir}}}},
			InitContainers: []corev1.Container{{Name: takeoverInit, Image: image, Command: []string{"true"},
				SecurityContext: &corev1.SecurityContext{Privileged: new(true)},
				VolumeMounts:    []corev1.VolumeMount{{Name: "nvidia-driver", MountPath: "/run/nvidia"}}}},
			Containers: []corev1.Container{{Name: podtemplate.DefaultContainer, Image: image}},
		}}}
	if err := c.Create(ctx, tmpl); err != nil {
		return fmt.Errorf("hostile: creating the PodTemplate %s: %w", takeoverTemplate, err)
	}
	return nil
}

// leave does on the stand-in node what a hostile action's container does on a real one
// before it exits 0: it leaves its files in the attempt's staged output, where the
// executor reads them. Other pods leave nothing.
func leave(p *plan, pod *corev1.Pod) error {
	if p == nil || (p.kind != kindErrorDoc && p.kind != kindOutputTree) {
		return nil
	}
	out := ""
	for _, v := range pod.Spec.Volumes {
		if v.Name == flytek8s.OutputsVolume && v.HostPath != nil {
			out = v.HostPath.Path
		}
	}
	if out == "" {
		return fmt.Errorf("pod %s mounts no staged output", pod.Name)
	}
	if p.kind == kindErrorDoc {
		// truncate -s 64G: a sparse file, which costs the task nothing.
		path := filepath.Join(out, "error.json")
		if err := createIfMissing(path); err != nil {
			return err
		}
		return os.Truncate(path, 64<<30)
	}
	for i := range outputTreeFiles {
		if err := createIfMissing(filepath.Join(out, fmt.Sprintf("f%d", i))); err != nil {
			return err
		}
	}
	return nil
}

func createIfMissing(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// hasMark says a file holds the mark of hostile's inputs.
func hasMark(path string) bool {
	raw, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(raw), hostileMark)
}
