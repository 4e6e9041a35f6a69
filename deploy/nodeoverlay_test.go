package deploy_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/services/auth/devcreds"
)

// TestNodeOverlayChangesOnlyWhatTheNetworkForces holds overlays/node (make deploy-node's)
// to its promise: it is the base, but for what a node that may send nothing off
// 127.0.0.0/8 forces. Each allowed change is undone here; whatever is left must be the
// base, object for object.
func TestNodeOverlayChangesOnlyWhatTheNetworkForces(t *testing.T) {
	base := byID(t, render(t, filepath.Join("deploy", "kustomize", "base")))
	node := byID(t, render(t, filepath.Join("deploy", "kustomize", "overlays", "node")))
	var nodeConfig string
	for id, obj := range node {
		if strings.HasPrefix(id, "ConfigMap/executor-config-node-") {
			nodeConfig, _, _ = unstructured.NestedString(obj.Object, "data", "config.yaml")
			delete(node, id)
		}
	}
	baseConfig := ""
	for id, obj := range base {
		if strings.HasPrefix(id, "ConfigMap/executor-config-") {
			baseConfig, _, _ = unstructured.NestedString(obj.Object, "data", "config.yaml")
		}
	}
	checkNodeConfig(t, baseConfig, nodeConfig)

	for _, id := range slices.Sorted(maps.Keys(node)) {
		if _, ok := base[id]; !ok {
			t.Errorf("%s is in the node overlay, not in the base", id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(base)) {
		got, ok := node[id]
		if !ok {
			t.Errorf("%s is in the base, not in the node overlay", id)
			continue
		}
		switch got.GetKind() {
		case "Deployment":
			undoNodeChanges(t, got, base[id])
		case "Job":
			undoNodeJobChanges(t, got, base[id])
		}
		if !reflect.DeepEqual(got.Object, base[id].Object) {
			t.Errorf("%s differs from the base beyond what the network forces:\n%s", id, jsonDiff(t, base[id].Object, got.Object))
		}
	}
}

// checkNodeConfig: the executor's extra configuration names only the listen addresses
// (the base's ports on 127.0.0.1) and the mounted file store, and loads over the base's.
func checkNodeConfig(t *testing.T, baseYAML, nodeYAML string) {
	t.Helper()
	if nodeYAML == "" {
		t.Fatal("the node overlay has no executor-config-node")
	}
	var b, n map[string]any
	if err := yaml.Unmarshal([]byte(baseYAML), &b); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(nodeYAML), &n); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"metricsBindAddress", "healthProbeBindAddress"} {
		basePort := strings.TrimPrefix(fmt.Sprint(b[key]), ":")
		if n[key] != "127.0.0.1:"+basePort {
			t.Errorf("%s: %v; want the base's port on loopback, 127.0.0.1:%s", key, n[key], basePort)
		}
		delete(n, key)
	}
	if !reflect.DeepEqual(n, map[string]any{"k8s": map[string]any{"mountFileStorage": true}}) {
		t.Errorf("executor-config-node sets more than the listen addresses and k8s.mountFileStorage: %v", n)
	}
	// The files the base names are the pod's; stand-ins take their place here.
	dir := t.TempDir()
	standIns, err := devcreds.Ensure(filepath.Join(dir, "creds"))
	if err != nil {
		t.Fatal(err)
	}
	b["serviceTokenFile"], b["serviceCAFile"] = standIns.ExecutorTokenFile, standIns.CAFile
	local, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(dir, "base.yaml"), filepath.Join(dir, "node.yaml")}
	for i, content := range []string{string(local), nodeYAML} {
		if err := os.WriteFile(files[i], []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.LoadFiles(files...)
	if err != nil {
		t.Fatalf("the node's configuration over the base's: %v", err)
	}
	// The mounted directory is the one the base's storage prefixes name.
	if len(cfg.Storage.AllowedPrefixes) != 1 || !strings.HasPrefix(cfg.Storage.AllowedPrefixes[0], "file://"+nodeDataDir+"/") {
		t.Errorf("storage.allowedPrefixes %v; the overlay mounts %s for them", cfg.Storage.AllowedPrefixes, nodeDataDir)
	}
}

// nodeDataDir is the overlay's hostPath for the actions' data.
const nodeDataDir = "/tmp/flyte"

// undoNodeChanges checks each change the node overlay makes to a Deployment and puts
// the base's value back, so that what is left can be compared with the base.
func undoNodeChanges(t *testing.T, got, base *unstructured.Unstructured) {
	t.Helper()
	id := got.GetKind() + "/" + got.GetName()
	undo := func(want any, fields ...string) {
		t.Helper()
		v, found, _ := unstructured.NestedFieldNoCopy(got.Object, fields...)
		if !found || !sameJSON(t, v, want) {
			t.Errorf("%s: %s is %v; want %v", id, strings.Join(fields, "."), v, want)
		}
		if b, ok, _ := unstructured.NestedFieldCopy(base.Object, fields...); ok {
			_ = unstructured.SetNestedField(got.Object, b, fields...)
		} else {
			unstructured.RemoveNestedField(got.Object, fields...)
		}
	}
	// Host network, and a rollout that stops the old pod first (its ports are the node's).
	undo(true, "spec", "template", "spec", "hostNetwork")
	undo(map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": 0, "maxUnavailable": 1}}, "spec", "strategy")
	if got.GetName() == "executor" {
		undo([]any{map[string]any{"ip": "127.0.0.1", "hostnames": []any{"events", "cacheservice"}}}, "spec", "template", "spec", "hostAliases")
	}

	gotPod, _, _ := unstructured.NestedMap(got.Object, "spec", "template", "spec")
	basePod, _, _ := unstructured.NestedMap(base.Object, "spec", "template", "spec")
	gotC, baseC := container(gotPod), container(basePod)

	// The images make images builds, by the base's names.
	if image, baseImage := gotC["image"].(string), baseC["image"].(string); image != strings.TrimSuffix(baseImage, ":latest")+":dev" {
		t.Errorf("%s: image %s; want %s at tag dev", id, image, baseImage)
	}
	gotC["image"] = baseC["image"]

	// The API server by its loopback address.
	env := gotC["env"].([]any)
	wantEnv := []any{
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "valueFrom": map[string]any{"configMapKeyRef": map[string]any{"name": "node-apiserver", "key": "port"}}},
	}
	if n := len(env) - len(wantEnv); n < 0 || !reflect.DeepEqual(env[n:], wantEnv) {
		t.Errorf("%s: env %v; want the base's, then %v", id, env, wantEnv)
	} else {
		gotC["env"] = env[:n]
	}

	// Listening on loopback: --flag=:port becomes --flag=127.0.0.1:port.
	args, _ := gotC["args"].([]any)
	baseArgs, _ := baseC["args"].([]any)
	if got.GetName() == "executor" {
		extra := []any{"--config", "/etc/flyte/node/config.yaml"}
		if n := len(args) - len(extra); n < 0 || !reflect.DeepEqual(args[n:], extra) {
			t.Errorf("%s: args %v; want the base's, then %v", id, args, extra)
		} else {
			args = args[:n]
		}
	}
	if len(args) == len(baseArgs) {
		for i := range args {
			a, b := args[i].(string), baseArgs[i].(string)
			flag, port, ok := strings.Cut(b, "=:")
			if a != b && !(ok && a == flag+"=127.0.0.1:"+port) {
				t.Errorf("%s: argument %q; the base's is %q, and only a listen address may move to 127.0.0.1", id, a, b)
			}
		}
		args = baseArgs
	}
	if args != nil {
		gotC["args"] = args
	}

	if got.GetName() == "executor" {
		// The node's configuration layer and its data directory.
		volumes := gotPod["volumes"].([]any)
		wantVolumes := []any{
			map[string]any{"name": "node-config", "configMap": map[string]any{"name": configMapName(t, volumes, "node-config")}},
			map[string]any{"name": "data", "hostPath": map[string]any{"path": nodeDataDir, "type": "Directory"}},
		}
		if n := len(volumes) - len(wantVolumes); n < 0 || !reflect.DeepEqual(volumes[n:], wantVolumes) {
			t.Errorf("%s: volumes %v; want the base's, then %v", id, volumes, wantVolumes)
		} else {
			gotPod["volumes"] = volumes[:n]
		}
		mounts := gotC["volumeMounts"].([]any)
		wantMounts := []any{
			map[string]any{"name": "node-config", "mountPath": "/etc/flyte/node", "readOnly": true},
			map[string]any{"name": "data", "mountPath": nodeDataDir},
		}
		if n := len(mounts) - len(wantMounts); n < 0 || !reflect.DeepEqual(mounts[n:], wantMounts) {
			t.Errorf("%s: volumeMounts %v; want the base's, then %v", id, mounts, wantMounts)
		} else {
			gotC["volumeMounts"] = mounts[:n]
		}
	}
	gotPod["containers"].([]any)[0] = gotC
	undoDevImages(t, id, gotPod, basePod, "initContainers")
	if err := unstructured.SetNestedMap(got.Object, gotPod, "spec", "template", "spec"); err != nil {
		t.Fatal(err)
	}
}

// undoNodeJobChanges undoes a migration Job's changes: the host's network, to reach
// Postgres on 127.0.0.1, and the images make images builds.
func undoNodeJobChanges(t *testing.T, got, base *unstructured.Unstructured) {
	t.Helper()
	id := got.GetKind() + "/" + got.GetName()
	if v, _, _ := unstructured.NestedBool(got.Object, "spec", "template", "spec", "hostNetwork"); !v {
		t.Errorf("%s: not on the host's network", id)
	}
	unstructured.RemoveNestedField(got.Object, "spec", "template", "spec", "hostNetwork")
	gotPod, _, _ := unstructured.NestedMap(got.Object, "spec", "template", "spec")
	basePod, _, _ := unstructured.NestedMap(base.Object, "spec", "template", "spec")
	undoDevImages(t, id, gotPod, basePod, "containers")
	if err := unstructured.SetNestedMap(got.Object, gotPod, "spec", "template", "spec"); err != nil {
		t.Fatal(err)
	}
}

// undoDevImages sets the images of a pod's list of containers back to the base's, each
// of which must be the base's at tag dev.
func undoDevImages(t *testing.T, id string, gotPod, basePod map[string]any, list string) {
	t.Helper()
	gotCs, _ := gotPod[list].([]any)
	baseCs, _ := basePod[list].([]any)
	for i := range min(len(gotCs), len(baseCs)) {
		g, b := gotCs[i].(map[string]any), baseCs[i].(map[string]any)
		if image, baseImage := g["image"].(string), b["image"].(string); image != strings.TrimSuffix(baseImage, ":latest")+":dev" {
			t.Errorf("%s: %s image %s; want %s at tag dev", id, list, image, baseImage)
		}
		g["image"] = b["image"]
	}
}

// container is a pod spec's first (only) container.
func container(pod map[string]any) map[string]any {
	return pod["containers"].([]any)[0].(map[string]any)
}

// configMapName is the (hashed) ConfigMap name of a volume, if it names one.
func configMapName(t *testing.T, volumes []any, volume string) string {
	t.Helper()
	for _, v := range volumes {
		v := v.(map[string]any)
		if v["name"] == volume {
			if cm, ok := v["configMap"].(map[string]any); ok && strings.HasPrefix(fmt.Sprint(cm["name"]), "executor-config-node-") {
				return cm["name"].(string)
			}
		}
	}
	return "executor-config-node-<hash>"
}

func byID(t *testing.T, objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		out[id(o)] = o
	}
	return out
}

// jsonDiff shows two objects' differing top-level fields as JSON, for a failure.
func jsonDiff(t *testing.T, want, got map[string]any) string {
	t.Helper()
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if !reflect.DeepEqual(want[k], got[k]) {
			w, _ := json.Marshal(want[k])
			g, _ := json.Marshal(got[k])
			fmt.Fprintf(&b, "  %s\n    base: %s\n    node: %s\n", k, w, g)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			g, _ := json.Marshal(got[k])
			fmt.Fprintf(&b, "  %s (only in the node overlay): %s\n", k, g)
		}
	}
	return b.String()
}

// sameJSON compares two values as JSON, whatever Go types their numbers were decoded as.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}
