package deploy_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/test/kubetest"
	"github.com/flytekube/backend/test/repo"
)

var env *kubetest.Env

// No CRDs are preloaded: the one the overlays carry is applied like any other object.
// envtest's CRD installer logs through controller-runtime, which has nothing to say here.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(kubetest.Main(m, &env, kubetest.Options{}))
}

// overlays are checked one by one; external names the objects an overlay refers to but
// leaves to the operator, as "Kind/name".
var overlays = []struct {
	name     string
	external []string
}{
	{name: "dev"},
	{name: "production", external: []string{"Secret/flyte-database", "Issuer/flyte-services"}},
}

func TestOverlays(t *testing.T) {
	installCertManagerCRDs(t)
	for _, o := range overlays {
		t.Run(o.name, func(t *testing.T) {
			objs := render(t, filepath.Join("deploy", "kustomize", "overlays", o.name))
			rbac := applyAll(t, objs)
			checkPods(t, objs, o.external)
			checkServices(t, objs)
			checkExecutor(t, objs, rbac)
			checkServers(t, objs, rbac)
			checkNetworkPolicies(t, objs)
			checkIssuers(t, objs, o.external)
		})
	}
}

// installCertManagerCRDs installs stand-ins for cert-manager's CRDs (testdata), which a
// cluster running the overlays has.
func installCertManagerCRDs(t *testing.T) {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	_, err = envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths:              []string{filepath.Join(root, "deploy", "testdata", "cert-manager-crds.yaml")},
		ErrorIfPathMissing: true,
		MaxTime:            time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// render runs the pinned kustomize from the repository root, as a user would.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile=tools/go.mod", "kustomize", "build", dir)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.String())
	}
	objs := decodeObjects(t, out)
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s rendered nothing", dir)
	}
	return objs
}

// applyServed applies objs as the test's field owner, and returns once the API server
// serves the CRDs among them.
func applyServed(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, u := range objs {
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), client.FieldOwner("deploy-test"), client.ForceOwnership); err != nil {
			t.Fatalf("applying %s: %v", id(u), err)
		}
		if u.GetKind() == "CustomResourceDefinition" {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			convert(t, u, crd)
			crds = append(crds, crd)
		}
	}
	if err := envtest.WaitForCRDs(env.Config, crds, envtest.CRDInstallOptions{MaxTime: time.Minute, PollInterval: 100 * time.Millisecond}); err != nil {
		t.Fatalf("the CRDs: %v", err)
	}
}

// decodeObjects reads a stream of YAML documents.
func decodeObjects(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

// applyAll has the API server admit every object by server-side apply: decoded against
// its schema (an unknown field fails), defaulted and validated. CRDs and namespaces are
// applied for real, since namespaced and custom objects cannot even be dry-run without
// them, and so is RBAC, which the checks ask the API server about (rbacReviews) and
// which is removed when the test ends; everything else is a dry run, admitted but not
// stored, so nothing of one overlay is left behind for the next.
func applyAll(t *testing.T, objs []*unstructured.Unstructured) *rbacReviews {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	apply := func(u *unstructured.Unstructured, opts ...client.ApplyOption) error {
		opts = append(opts, client.FieldOwner("deploy-test"), client.ForceOwnership)
		return env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), opts...)
	}
	first := func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "CustomResourceDefinition" || u.GetKind() == "Namespace"
	}
	applyServed(t, slices.DeleteFunc(slices.Clone(objs), func(u *unstructured.Unstructured) bool { return !first(u) }))
	rbac := &rbacReviews{t: t}
	t.Cleanup(rbac.remove)
	for _, u := range objs {
		// Without a namespace kubectl would put the object in whatever namespace the
		// user's context names.
		if namespaced, err := env.Client.IsObjectNamespaced(u); err == nil && namespaced && u.GetNamespace() == "" {
			t.Errorf("%s has no namespace", id(u))
			continue
		}
		switch {
		case first(u):
		case u.GetAPIVersion() == rbacv1.SchemeGroupVersion.String():
			if err := apply(u); err != nil {
				t.Errorf("applying %s: %v", id(u), err)
				continue
			}
			rbac.applied = append(rbac.applied, u)
		default:
			if err := apply(u, client.DryRunAll); err != nil {
				t.Errorf("dry-run applying %s: %v", id(u), err)
			}
		}
	}
	return rbac
}

// checkPods holds every pod template to the hardening the manifests promise, and
// requires that everything it refers to is rendered too (or is named as external): a
// misspelt Secret or ConfigMap name passes the API server but leaves the pod pending.
func checkPods(t *testing.T, objs []*unstructured.Unstructured, external []string) {
	t.Helper()
	for name, spec := range podSpecs(t, objs) {
		if sa := spec.ServiceAccountName; sa != "" && sa != "default" {
			find(t, objs, "ServiceAccount", sa, external)
		}
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil {
				find(t, objs, "ConfigMap", v.ConfigMap.Name, external)
			}
			if v.Secret != nil {
				findKeys(t, objs, name+" volume "+v.Name, "Secret", v.Secret.SecretName, v.Secret.Items, external)
			}
			if v.Projected != nil {
				for _, src := range v.Projected.Sources {
					if src.Secret != nil {
						findKeys(t, objs, name+" volume "+v.Name, "Secret", src.Secret.Name, src.Secret.Items, external)
					}
					if src.ConfigMap != nil {
						findKeys(t, objs, name+" volume "+v.Name, "ConfigMap", src.ConfigMap.Name, src.ConfigMap.Items, external)
					}
				}
			}
		}
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			where := name + " container " + c.Name
			sc := c.SecurityContext
			if sc == nil {
				sc = &corev1.SecurityContext{}
			}
			nonRoot, user := sc.RunAsNonRoot, sc.RunAsUser
			if ps := spec.SecurityContext; ps != nil {
				nonRoot, user = cmp.Or(nonRoot, ps.RunAsNonRoot), cmp.Or(user, ps.RunAsUser)
			}
			if nonRoot == nil || !*nonRoot || (user != nil && *user == 0) {
				t.Errorf("%s may run as root (runAsNonRoot %v, runAsUser %v)", where, deref(nonRoot), deref(user))
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s has a writable root filesystem", where)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s allows privilege escalation", where)
			}
			if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s lacks a memory request or limit", where)
			}
			for _, e := range c.Env {
				switch {
				case e.ValueFrom == nil:
				case e.ValueFrom.SecretKeyRef != nil:
					ref := e.ValueFrom.SecretKeyRef
					if s := find(t, objs, "Secret", ref.Name, external); s != nil && !hasKey(s, ref.Key) {
						t.Errorf("%s: Secret %s has no key %s", where, ref.Name, ref.Key)
					}
				case e.ValueFrom.ConfigMapKeyRef != nil:
					ref := e.ValueFrom.ConfigMapKeyRef
					if cm := find(t, objs, "ConfigMap", ref.Name, external); cm != nil && !hasKey(cm, ref.Key) {
						t.Errorf("%s: ConfigMap %s has no key %s", where, ref.Name, ref.Key)
					}
				}
				if strings.HasPrefix(e.Value, "http://") {
					checkURL(t, objs, where+" env "+e.Name, e.Value)
				}
			}
		}
	}
}

// checkServices requires every Service to select some pod template and every target
// port name to be a port of that template's containers.
func checkServices(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	specs, templateLabels := podSpecs(t, objs), podLabels(t, objs)
	for _, u := range objs {
		if u.GetKind() != "Service" {
			continue
		}
		var svc corev1.Service
		convert(t, u, &svc)
		var matched string
		for name, l := range templateLabels {
			if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(l)) {
				matched = name
			}
		}
		if matched == "" {
			t.Errorf("Service %s selects no pods", svc.Name)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.Type == intstr.String && port(specs[matched], p.TargetPort.StrVal) == 0 {
				t.Errorf("Service %s port %s: %s has no port named %s", svc.Name, p.Name, matched, p.TargetPort.StrVal)
			}
		}
	}
}

// checkExecutor follows the executor's --config to the ConfigMap key it names, loads it
// as the executor would, and checks the rest of the manifest agrees with it: probe and
// metrics ports, the services' addresses, leader election for more than one replica,
// and the permissions the executor needs.
func checkExecutor(t *testing.T, objs []*unstructured.Unstructured, rbac *rbacReviews) {
	t.Helper()
	var d appsv1.Deployment
	convert(t, must(t, objs, "Deployment", "executor"), &d)
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	args, err := containerFlags(c.Image, c.Args)
	if err != nil {
		t.Fatalf("executor: %v", err)
	}
	file := args["config"]
	if file == "" {
		t.Fatalf("executor args %q name no --config", c.Args)
	}
	data := configMapFile(t, objs, spec, c, file)
	// The token and the CA the config names come from the pod's volumes (checked
	// below); here stand-ins take their place, since the executor reads them at start.
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(data), &raw); err != nil {
		t.Fatal(err)
	}
	tokenFile, _ := raw["serviceTokenFile"].(string)
	caFile, _ := raw["serviceCAFile"].(string)
	standIns, err := devcreds.Ensure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if tokenFile != "" {
		raw["serviceTokenFile"] = standIns.ExecutorTokenFile
	}
	if caFile != "" {
		raw["serviceCAFile"] = standIns.CAFile
	}
	local := filepath.Join(t.TempDir(), "config.yaml")
	if out, err := yaml.Marshal(raw); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(local, out, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(local)
	if err != nil {
		t.Fatalf("the executor would not start with %s: %v", file, err)
	}
	checkExecutorCredentials(t, objs, rbac, d, c, tokenFile, caFile)
	if len(cfg.Storage.AllowedPrefixes) == 0 {
		t.Error("executor config: no storage.allowedPrefixes: actions could reuse cached outputs only within a run, and file:// is refused")
	}

	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil {
		t.Fatal("executor lacks HTTP liveness and readiness probes")
	}
	wantPort := func(what, addr string, got int32) {
		_, p, err := net.SplitHostPort(addr)
		if err != nil || p != fmt.Sprint(got) {
			t.Errorf("executor %s: the config listens on %q, the pod's port is %d", what, addr, got)
		}
	}
	wantPort("liveness probe", cfg.HealthProbeBindAddress, probePort(c, c.LivenessProbe))
	wantPort("readiness probe", cfg.HealthProbeBindAddress, probePort(c, c.ReadinessProbe))
	wantPort("metrics", cfg.MetricsBindAddress, port(spec, "metrics"))
	for _, u := range []string{cfg.EventsServiceURL, cfg.CacheServiceURL} {
		if u == "" {
			t.Errorf("executor config: a service URL is empty (events %q, cache %q)", cfg.EventsServiceURL, cfg.CacheServiceURL)
			continue
		}
		checkURL(t, objs, "executor config", u)
		if !strings.HasPrefix(u, "https://") {
			t.Errorf("executor config: %s: the token would cross the network in the clear; want https", u)
		}
	}
	if d.Spec.Replicas != nil && *d.Spec.Replicas > 1 && !cfg.LeaderElect {
		t.Errorf("%d executor replicas without leaderElect would reconcile the same actions at once", *d.Spec.Replicas)
	}

	checkExecutorRBAC(t, objs, rbac, d, cfg.Namespaces)
}

// checkExecutorRBAC holds the executor's permissions, as the API server grants them to
// its ServiceAccount, to its configuration: pods in the namespaces it manages (every one
// when namespaces is empty, by ClusterRoleBinding flyte-executor-tasks; else by a
// RoleBinding in each listed one and nowhere else), leases and Secrets in its own
// namespace, and never a Secret of a task namespace.
func checkExecutorRBAC(t *testing.T, objs []*unstructured.Unstructured, rbac *rbacReviews, d appsv1.Deployment, namespaces []string) {
	t.Helper()
	executor := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: d.Spec.Template.Spec.ServiceAccountName, Namespace: d.Namespace}
	managed := namespaces
	if len(managed) == 0 {
		managed = []string{"team-a", "any-namespace"}
	}
	for _, ns := range managed {
		for _, r := range []struct{ group, resource, verb string }{{"", "pods", "create"}, {"batch", "jobs", "create"}, {"flyte.org", "taskactions", "watch"}, {"", "events", "create"}} {
			if !rbac.allowed(executor, ns, r.group, r.resource, r.verb) {
				t.Errorf("RBAC does not allow %s %s in managed namespace %s to ServiceAccount %s/%s (ClusterRole flyte-executor-tasks)", r.verb, r.resource, ns, d.Namespace, executor.Name)
			}
		}
	}
	if !rbac.allowed(executor, d.Namespace, "coordination.k8s.io", "leases", "update") {
		t.Errorf("RBAC does not allow leader election in %s to ServiceAccount %s (Role and RoleBinding flyte-executor)", d.Namespace, executor.Name)
	}
	if !rbac.allowed(executor, d.Namespace, "", "secrets", "get") {
		t.Errorf("RBAC does not allow its own Secrets in %s to ServiceAccount %s (Role flyte-executor)", d.Namespace, executor.Name)
	}
	// Denials, asked once the grants above show the authorizer has the overlay's RBAC.
	for _, ns := range managed {
		if rbac.allowedNow(executor, ns, "", "secrets", "get") || rbac.allowedNow(executor, ns, "", "secrets", "list") {
			t.Errorf("ServiceAccount %s/%s may read Secrets in task namespace %s: the kubelet delivers an action's secrets, the executor must not", d.Namespace, executor.Name, ns)
		}
	}
	if len(namespaces) == 0 {
		return
	}
	if rbac.allowedNow(executor, "unmanaged", "", "pods", "create") {
		t.Errorf("ServiceAccount %s/%s may create pods in a namespace outside its configured namespaces %v", d.Namespace, executor.Name, namespaces)
	}
	// Each listed namespace has its RoleBinding, and no RoleBinding of the role is
	// elsewhere: the configuration and the grants are one list.
	var bound []string
	for _, u := range objs {
		var rb rbacv1.RoleBinding
		if u.GetKind() != "RoleBinding" {
			continue
		}
		convert(t, u, &rb)
		if rb.RoleRef.Kind == "ClusterRole" && rb.RoleRef.Name == "flyte-executor-tasks" {
			bound = append(bound, rb.Namespace)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(bound)), slices.Sorted(slices.Values(namespaces))) {
		t.Errorf("RoleBindings of flyte-executor-tasks in %v, the executor configured for %v: the two lists must agree", bound, namespaces)
	}
}

// configMapFile returns the content of the file at path in container c, which must come
// from a ConfigMap volume.
func configMapFile(t *testing.T, objs []*unstructured.Unstructured, spec corev1.PodSpec, c corev1.Container, file string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Dir(file) != path.Clean(m.MountPath) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			key := path.Base(file)
			for _, item := range v.ConfigMap.Items {
				if item.Path == key {
					key = item.Key
				}
			}
			var cm corev1.ConfigMap
			convert(t, must(t, objs, "ConfigMap", v.ConfigMap.Name), &cm)
			data, ok := cm.Data[key]
			if !ok {
				t.Fatalf("ConfigMap %s has no key %s for %s (keys: %v)", cm.Name, key, file, slices.Sorted(maps.Keys(cm.Data)))
			}
			return data
		}
	}
	t.Fatalf("no ConfigMap is mounted where %s is", file)
	return ""
}

// checkURL requires an http://name:port URL to reach a rendered Service's port.
func checkURL(t *testing.T, objs []*unstructured.Unstructured, where, raw string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	host := strings.Split(u.Hostname(), ".")[0] // "events" and "events.flyte.svc" alike
	found := find(t, objs, "Service", host, nil)
	if found == nil {
		return
	}
	var svc corev1.Service
	convert(t, found, &svc)
	for _, p := range svc.Spec.Ports {
		if fmt.Sprint(p.Port) == u.Port() {
			if tlsPort := p.AppProtocol != nil && *p.AppProtocol == "https"; tlsPort != (u.Scheme == "https") {
				t.Errorf("%s: %s: Service %s port %d has appProtocol %v", where, raw, host, p.Port, deref(p.AppProtocol))
			}
			return
		}
	}
	t.Errorf("%s: %s: Service %s has no port %s", where, raw, host, u.Port())
}

// podSpecs returns the pod templates of the workloads, by "Kind/name".
func podSpecs(t *testing.T, objs []*unstructured.Unstructured) map[string]corev1.PodSpec {
	specs := map[string]corev1.PodSpec{}
	for name, tmpl := range podTemplates(t, objs) {
		specs[name] = tmpl.Spec
	}
	return specs
}

func podLabels(t *testing.T, objs []*unstructured.Unstructured) map[string]map[string]string {
	labels := map[string]map[string]string{}
	for name, tmpl := range podTemplates(t, objs) {
		labels[name] = tmpl.Labels
	}
	return labels
}

func podTemplates(t *testing.T, objs []*unstructured.Unstructured) map[string]corev1.PodTemplateSpec {
	t.Helper()
	out := map[string]corev1.PodTemplateSpec{}
	for _, u := range objs {
		switch u.GetKind() {
		case "Deployment":
			var d appsv1.Deployment
			convert(t, u, &d)
			out[id(u)] = d.Spec.Template
		case "StatefulSet":
			var s appsv1.StatefulSet
			convert(t, u, &s)
			out[id(u)] = s.Spec.Template
		case "Job":
			var j batchv1.Job
			convert(t, u, &j)
			out[id(u)] = j.Spec.Template
		case "DaemonSet", "ReplicaSet", "CronJob", "Pod":
			t.Fatalf("%s: teach this test its pod template, or it goes unchecked", id(u))
		}
	}
	return out
}

// find returns the rendered object, or nil when it is missing: an error unless it is
// one of the external ones. A Secret that a cert-manager Certificate names is found as
// cert-manager writes it.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, external []string) *unstructured.Unstructured {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	if kind == "Secret" {
		if cert := certificateOf(objs, name); cert != nil {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
				"metadata": map[string]any{"name": name, "namespace": cert.GetNamespace()},
				"data":     map[string]any{"tls.crt": "", "tls.key": "", "ca.crt": ""},
			}}
		}
	}
	if !slices.Contains(external, kind+"/"+name) {
		t.Errorf("%s %s is referred to but not rendered", kind, name)
	}
	return nil
}

// must returns the rendered object, and stops the test when it is missing.
func must(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	u := find(t, objs, kind, name, nil)
	if u == nil {
		t.FailNow()
	}
	return u
}

// findKeys finds a Secret or ConfigMap and requires it to hold the keys items name.
func findKeys(t *testing.T, objs []*unstructured.Unstructured, where, kind, name string, items []corev1.KeyToPath, external []string) {
	t.Helper()
	u := find(t, objs, kind, name, external)
	if u == nil {
		return
	}
	for _, item := range items {
		if !hasKey(u, item.Key) {
			t.Errorf("%s: %s %s has no key %s", where, kind, name, item.Key)
		}
	}
}

// certificateOf returns the cert-manager Certificate that writes the Secret name.
func certificateOf(objs []*unstructured.Unstructured, name string) *unstructured.Unstructured {
	for _, u := range objs {
		if secret, _, _ := unstructured.NestedString(u.Object, "spec", "secretName"); u.GetKind() == "Certificate" && secret == name {
			return u
		}
	}
	return nil
}

func hasKey(u *unstructured.Unstructured, key string) bool {
	for _, field := range []string{"data", "stringData", "binaryData"} {
		if _, ok, _ := unstructured.NestedFieldNoCopy(u.Object, field, key); ok {
			return true
		}
	}
	return false
}

func port(spec corev1.PodSpec, name string) int32 {
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
	}
	return 0
}

func probePort(c corev1.Container, p *corev1.Probe) int32 {
	if p.HTTPGet.Port.Type == intstr.Int {
		return p.HTTPGet.Port.IntVal
	}
	return port(corev1.PodSpec{Containers: []corev1.Container{c}}, p.HTTPGet.Port.StrVal)
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s: %v", id(u), err)
	}
}

func id(u *unstructured.Unstructured) string { return u.GetKind() + "/" + u.GetName() }

func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}
