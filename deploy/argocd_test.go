package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	lua "github.com/yuin/gopher-lua"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
)

// healthKey is the argocd-cm key Argo CD reads the TaskAction health check from.
const healthKey = "resource.customizations.health.flyte.org_TaskAction"

var taskActionGVK = schema.GroupVersionKind{Group: "flyte.org", Version: "v1", Kind: "TaskAction"}

// argoHealth is what a health script returns, as Argo CD reads it.
type argoHealth struct {
	Status  string `json:"status"`
	Message string `json:"message,omitempty"`
}

// runHealthLua runs script on obj as Argo CD runs a health check of argocd-cm
// (util/lua in argoproj/argo-cd): a state without the standard libraries but base,
// package and table (Argo CD adds a safe subset of os, which the script does not use;
// useOpenLibs is off unless the operator sets it), obj a global table made from the
// object as its cache decodes it (integers int64), the returned table read as status and
// message. A status Argo CD does not know is an error here, where Argo CD would show
// Unknown.
func runHealthLua(script string, obj map[string]any) (argoHealth, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return argoHealth{}, fmt.Errorf("opening %s: %w", lib.name, err)
		}
	}
	l.SetGlobal("obj", luaValue(l, obj))
	if err := l.DoString(script); err != nil {
		return argoHealth{}, fmt.Errorf("running the health script: %w", err)
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return argoHealth{}, fmt.Errorf("the health script returned %s, not a table", l.Get(-1).Type())
	}
	var h argoHealth
	for key, into := range map[string]*string{"status": &h.Status, "message": &h.Message} {
		switch v := ret.RawGetString(key).(type) {
		case lua.LString:
			*into = string(v)
		case *lua.LNilType:
		default:
			return argoHealth{}, fmt.Errorf("the health script's %s is a %s, not a string", key, v.Type())
		}
	}
	if !slices.Contains([]string{"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}, h.Status) {
		return argoHealth{}, fmt.Errorf("the health script returned status %q, which Argo CD does not know", h.Status)
	}
	return h, nil
}

// luaValue converts a decoded JSON value as Argo CD's decodeValue does.
func luaValue(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := l.CreateTable(len(v), 0)
		for _, item := range v {
			t.Append(luaValue(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(v))
		for key, item := range v {
			t.RawSetH(lua.LString(key), luaValue(l, item))
		}
		return t
	}
	return lua.LNil
}

// readObject reads a YAML object as the API server's clients decode it.
func readObject(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var obj map[string]any
	if err := utiljson.Unmarshal(js, &obj); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return obj
}

func readHealthScript(t *testing.T) string {
	t.Helper()
	path, err := repo.Path("deploy", "argocd", "health.lua")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestArgoCDHealthCases runs deploy/argocd/health_test.yaml as Argo CD runs its own
// resource_customizations' cases, and has the API server accept each fixture as a
// TaskAction with that status, so that none is a shape the executor cannot write.
// The cases must cover every phase, a retry's backoff and an action with no status.
func TestArgoCDHealthCases(t *testing.T) {
	dir, err := repo.Path("deploy", "argocd")
	if err != nil {
		t.Fatal(err)
	}
	script := readHealthScript(t)
	raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cases struct {
		Tests []struct {
			HealthStatus argoHealth `json:"healthStatus"`
			InputPath    string     `json:"inputPath"`
		} `json:"tests"`
	}
	if err := yaml.UnmarshalStrict(raw, &cases); err != nil {
		t.Fatalf("health_test.yaml: %v", err)
	}
	applyTaskActionCRD(t)
	ns := kubetest.ProjectNamespace(t, env.Client, "demo")

	seen := map[string]bool{}
	for _, c := range cases.Tests {
		t.Run(c.InputPath, func(t *testing.T) {
			obj := readObject(t, filepath.Join(dir, c.InputPath))
			got, err := runHealthLua(script, obj)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.HealthStatus {
				t.Errorf("health = %+v, want %+v", got, c.HealthStatus)
			}
			phase, _, _ := unstructured.NestedString(obj, "status", "phase")
			seen[phase] = true
			if _, backoff, _ := unstructured.NestedString(obj, "status", "nextAttemptAt"); backoff {
				seen["backoff"] = true
			}
			admit(t, obj, ns)
		})
	}
	for _, p := range append(flytev1.Phases(), "", "backoff") {
		if !seen[string(p)] {
			t.Errorf("no case of %q (an empty phase is an action without status)", p)
		}
	}
}

// admit creates obj in namespace ns and writes its status through the status
// subresource, as the executor does: the CRD's schema and rules must take both. What
// only the API server sets (a deletion, the generation) is left to it.
func admit(t *testing.T, obj map[string]any, ns string) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{}}
	for k, v := range obj {
		u.Object[k] = v
	}
	u = u.DeepCopy()
	status, hasStatus := u.Object["status"]
	delete(u.Object, "status")
	for _, f := range []string{"uid", "generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers"} {
		unstructured.RemoveNestedField(u.Object, "metadata", f)
	}
	u.SetNamespace(ns)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := env.Client.Create(ctx, u); err != nil {
		t.Fatalf("the API server refuses the fixture's object: %v", err)
	}
	if !hasStatus {
		return
	}
	u.Object["status"] = status
	if err := env.Client.Status().Update(ctx, u); err != nil {
		t.Fatalf("the API server refuses the fixture's status: %v", err)
	}
}

// applyTaskActionCRD installs the TaskAction CRD in the package's API server, which
// starts without it.
func applyTaskActionCRD(t *testing.T) {
	t.Helper()
	path, err := repo.Path("deploy", "crd", "flyte.org_taskactions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.ApplyCRD(t.Context(), env.Client, path, "argocd-health"); err != nil {
		t.Fatal(err)
	}
}

// TestArgoCDConfigMapCarriesTheScript renders the Component deploy/argocd into an Argo CD
// kustomization's argocd-cm, as docs/operations.md says to install it: the key holds
// health.lua byte for byte, and the ConfigMap keeps its name and its other keys.
func TestArgoCDConfigMapCarriesTheScript(t *testing.T) {
	script := readHealthScript(t)
	objs := render(t, "deploy/testdata/argocd")
	if len(objs) != 1 {
		t.Fatalf("rendered %d objects, want argocd-cm alone", len(objs))
	}
	cm := objs[0]
	if cm.GetKind() != "ConfigMap" || cm.GetName() != "argocd-cm" || cm.GetNamespace() != "argocd" {
		t.Fatalf("rendered %s %s/%s, want ConfigMap argocd/argocd-cm (Argo CD reads no other)", cm.GetKind(), cm.GetNamespace(), cm.GetName())
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	if data[healthKey] != script {
		t.Errorf("argocd-cm's %s is not deploy/argocd/health.lua:\n%s", healthKey, data[healthKey])
	}
	if data["timeout.reconciliation"] != "180s" {
		t.Errorf("argocd-cm lost its other keys: %v", slices.Collect(func(yield func(string) bool) {
			for k := range data {
				if !yield(k) {
					return
				}
			}
		}))
	}
}

// TestArgoCDHealthOfWhatTheExecutorWrites runs core-sleep actions through the executor on
// the API server and gives the health script every version of them a watch sees, as
// Argo CD's cache would: each must get the health of its phase, name its attempt and,
// once failed, its error; and between them they must reach success, a retry's backoff,
// failure, a timeout, a running attempt and an abort.
func TestArgoCDHealthOfWhatTheExecutorWrites(t *testing.T) {
	script := readHealthScript(t)
	applyTaskActionCRD(t)
	ns := kubetest.ProjectNamespace(t, env.Client, "demo")
	store := t.TempDir()

	cfg := config.Default()
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.GC.Interval = metav1.Duration{}
	cfg.EventsServiceURL, cfg.CacheServiceURL = "", ""
	cfg.Namespaces = []string{ns}
	cfg.Storage.AllowedPrefixes = []string{"file://" + store}
	// The retried action waits out its backoff for the rest of the test.
	cfg.RetryBackoff.Base, cfg.RetryBackoff.Cap = metav1.Duration{Duration: time.Hour}, metav1.Duration{Duration: time.Hour}
	kubetest.RunManager(t, func(ctx context.Context) (manager.Manager, error) {
		return executor.Setup(ctx, cfg, env.Config, slog.New(slog.DiscardHandler),
			executor.Options{SkipNameValidation: true, MetricsRegistry: prometheus.NewRegistry()})
	})

	wc, err := client.NewWithWatch(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(taskActionGVK.GroupVersion().WithKind("TaskActionList"))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	w, err := wc.Watch(ctx, list, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// Each action and the state it is followed to.
	actions := map[string]struct {
		config  map[string]any
		retries int64
		timeout string
		reached func(st map[string]any) bool
	}{
		"ok":      {config: map[string]any{"duration": "0s"}, reached: phaseIs("Succeeded")},
		"fail":    {config: map[string]any{"duration": "0s", "failAttempts": "1"}, reached: phaseIs("Failed")},
		"invalid": {config: map[string]any{"duration": "soon"}, reached: phaseIs("Failed")},
		"timeout": {config: map[string]any{"duration": "1h"}, timeout: "1s", reached: phaseIs("TimedOut")},
		"running": {config: map[string]any{"duration": "1h"}, reached: phaseIs("Running")},
		"abort":   {config: map[string]any{"duration": "1h"}, reached: phaseIs("Aborted")},
		"retry": {config: map[string]any{"duration": "0s", "failAttempts": "1"}, retries: 1, reached: func(st map[string]any) bool {
			next, _, _ := unstructured.NestedString(st, "nextAttemptAt")
			return st["phase"] == "Queued" && next != ""
		}},
	}
	for name, a := range actions {
		spec := map[string]any{
			"project": "demo", "domain": "development", "runName": "r1", "actionName": name,
			"taskName": "demo.sleepy", "taskType": "core-sleep", "config": a.config,
			"inputUri": "file://" + store + "/inputs.json", "runOutputBase": "file://" + store + "/r1",
		}
		if a.retries > 0 {
			spec["retries"] = a.retries
		}
		if a.timeout != "" {
			spec["timeout"] = a.timeout
		}
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetGroupVersionKind(taskActionGVK)
		u.SetName("r1-" + name)
		u.SetNamespace(ns)
		if err := env.Client.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}

	reached := map[string]bool{}
	versions := 0
	for len(reached) < len(actions) {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-ctx.Done():
			t.Fatalf("followed %d versions; reached only %v of the actions' ends", versions, slices.Sorted(func(yield func(string) bool) {
				for k := range reached {
					if !yield(k) {
						return
					}
				}
			}))
		}
		u, ok := ev.Object.(*unstructured.Unstructured)
		if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
			continue
		}
		versions++
		name := strings.TrimPrefix(u.GetName(), "r1-")
		got, err := runHealthLua(script, u.Object)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := healthAgrees(u.Object, got); err != nil {
			t.Errorf("%s at resourceVersion %s: %v", name, u.GetResourceVersion(), err)
		}
		st, _, _ := unstructured.NestedMap(u.Object, "status")
		if name == "abort" && st["phase"] == "Running" && u.GetDeletionTimestamp() == nil {
			// Deleted while it runs: the executor aborts the attempt and records it.
			if err := env.Client.Delete(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		if reached[name] || !actions[name].reached(st) {
			continue
		}
		reached[name] = true
		t.Logf("%s: %s: %s", name, got.Status, got.Message)
	}
}

func phaseIs(p string) func(map[string]any) bool {
	return func(st map[string]any) bool { return st["phase"] == p }
}

// healthAgrees says whether h is the health of obj's phase, read independently of the
// script: finished well, finished otherwise, not yet; naming the attempt and the error.
func healthAgrees(obj map[string]any, h argoHealth) error {
	phase, _, _ := unstructured.NestedString(obj, "status", "phase")
	attempts, _, _ := unstructured.NestedInt64(obj, "status", "attempts")
	code, _, _ := unstructured.NestedString(obj, "status", "error", "code")
	_, backoff, _ := unstructured.NestedString(obj, "status", "nextAttemptAt")
	want := "Progressing"
	switch p := flytev1.Phase(phase); {
	case p == flytev1.PhaseSucceeded:
		want = "Healthy"
	case p.IsTerminal():
		want = "Degraded"
	}
	var errs []error
	if h.Status != want {
		errs = append(errs, fmt.Errorf("phase %q is %s, want %s (%s)", phase, h.Status, want, h.Message))
	}
	if phase != "" && !strings.Contains(h.Message, fmt.Sprintf("attempt %d", max(attempts, 1))) {
		errs = append(errs, fmt.Errorf("message %q names no attempt %d", h.Message, max(attempts, 1)))
	}
	if code != "" && (want == "Degraded" || backoff) && !strings.Contains(h.Message, code) {
		errs = append(errs, fmt.Errorf("message %q does not say the error %s", h.Message, code))
	}
	return errors.Join(errs...)
}
