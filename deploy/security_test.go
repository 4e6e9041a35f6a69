package deploy_test

// What the overlays promise about security: the services authenticate callers and speak
// TLS, the executor calls them with an audience-bound token and their CA, and
// NetworkPolicies let only the executor (and namespaces labelled for viewers) reach them.

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flytekube/backend/services/auth"
)

// servers are the images that serve RPCs to authenticated callers.
var servers = []string{"ghcr.io/flytekube/events", "ghcr.io/flytekube/cacheservice"}

// server is a Deployment running one of the servers, and what its arguments say.
type server struct {
	d    appsv1.Deployment
	c    corev1.Container
	args map[string]string
	svc  *corev1.Service // the Service in front of its pods
}

func serversOf(t *testing.T, objs []*unstructured.Unstructured) []server {
	t.Helper()
	var out []server
	for _, u := range objs {
		if u.GetKind() != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		convert(t, u, &d)
		for _, c := range d.Spec.Template.Spec.Containers {
			image, _, _ := strings.Cut(c.Image, ":")
			if !slices.Contains(servers, image) {
				continue
			}
			args, err := containerFlags(image, c.Args)
			if err != nil {
				t.Errorf("Deployment %s container %s: %v", d.Name, c.Name, err)
			}
			s := server{d: d, c: c, args: args}
			for _, su := range objs {
				var svc corev1.Service
				if su.GetKind() == "Service" {
					convert(t, su, &svc)
					if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
						s.svc = &svc
					}
				}
			}
			out = append(out, s)
		}
	}
	if len(out) != len(servers) {
		t.Errorf("rendered %d Deployments of %v, want one each", len(out), servers)
	}
	return out
}

// containerFlags parses a container's arguments as the binary of its image does: image
// ghcr.io/flytekube/NAME runs ./NAME/cmd/NAME, as the Dockerfiles build it.
func containerFlags(image string, args []string) (map[string]string, error) {
	name, _, _ := strings.Cut(path.Base(image), ":")
	p, err := parseFlags("./"+name+"/cmd/"+name, args)
	if err == nil && len(p.args) > 0 {
		err = fmt.Errorf("arguments %q: %s takes none but flags", p.args, name)
	}
	if err != nil {
		return nil, fmt.Errorf("args %q: %w", args, err)
	}
	return p.values, nil
}

// checkServers requires each server to authenticate callers (in kubernetes mode with
// its own ServiceAccount, allowed to review tokens), to serve TLS from a certificate
// cert-manager issues for the name callers use, to be probed over HTTPS, and its Service
// to say https.
func checkServers(t *testing.T, objs []*unstructured.Unstructured, rbac *rbacReviews) {
	t.Helper()
	for _, s := range serversOf(t, objs) {
		where := "Deployment " + s.d.Name
		spec := s.d.Spec.Template.Spec
		switch mode := s.args["auth-mode"]; mode {
		case string(auth.ModeKubernetes):
			checkReviewer(t, objs, rbac, s)
		case string(auth.ModeTokenFile):
			if s.args["auth-token-file"] == "" {
				t.Errorf("%s: --auth-mode=token-file without --auth-token-file", where)
			}
		default:
			t.Errorf("%s: --auth-mode=%q: want kubernetes, so that only callers with a token and RBAC get in", where, mode)
		}

		// TLS from a Secret cert-manager writes for the Service's name.
		for _, flag := range []string{"tls-cert-file", "tls-key-file"} {
			file := s.args[flag]
			if file == "" {
				t.Errorf("%s: no --%s: it would speak cleartext and take tokens in the clear", where, flag)
				continue
			}
			secret, key, ok := secretFile(spec, s.c, file)
			if !ok {
				t.Errorf("%s: --%s=%s is in no Secret volume", where, flag, file)
				continue
			}
			if want := map[string]string{"tls-cert-file": "tls.crt", "tls-key-file": "tls.key"}[flag]; key != want {
				t.Errorf("%s: --%s=%s is key %s of Secret %s, want %s", where, flag, file, key, secret, want)
			}
			cert := certificateOf(objs, secret)
			if cert == nil {
				t.Errorf("%s: --%s: Secret %s is written by no Certificate", where, flag, secret)
				continue
			}
			dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
			if s.svc != nil && !slices.Contains(dnsNames, s.svc.Name) {
				t.Errorf("%s: Certificate %s names %v, not %s, which callers use", where, cert.GetName(), dnsNames, s.svc.Name)
			}
		}

		// Probes over HTTPS: a grpc probe cannot speak TLS.
		for name, p := range map[string]*corev1.Probe{"startup": s.c.StartupProbe, "liveness": s.c.LivenessProbe, "readiness": s.c.ReadinessProbe} {
			switch {
			case p == nil:
				t.Errorf("%s: no %s probe", where, name)
			case p.GRPC != nil:
				t.Errorf("%s: %s probe over grpc, which cannot speak TLS", where, name)
			case p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || probePort(s.c, p) != port(spec, "rpc"):
				t.Errorf("%s: %s probe %+v: want an HTTPS GET on the rpc port", where, name, p.ProbeHandler)
			}
		}
		if s.svc == nil {
			t.Errorf("%s: no Service selects its pods", where)
			continue
		}
		for _, p := range s.svc.Spec.Ports {
			if (p.TargetPort.StrVal == "rpc" || p.TargetPort.StrVal == "console") && (p.AppProtocol == nil || *p.AppProtocol != "https") {
				t.Errorf("Service %s port %s: appProtocol %v, want https", s.svc.Name, p.Name, deref(p.AppProtocol))
			}
		}
		checkConsole(t, s)
	}
}

// checkConsole requires a server's web console, when it serves one, to be its port
// named console and to speak TLS (docs/console.md).
func checkConsole(t *testing.T, s server) {
	t.Helper()
	listen := s.args["console-listen"]
	if listen == "" {
		return
	}
	where := "Deployment " + s.d.Name
	if p, err := portOf(listen); err != nil || int32(p) != port(s.d.Spec.Template.Spec, "console") {
		t.Errorf("%s: --console-listen=%s, but its port named console is %d", where, listen, port(s.d.Spec.Template.Spec, "console"))
	}
	if s.args["console-plaintext"] == "true" {
		t.Errorf("%s: --console-plaintext: tokens typed into the console would cross the network in the clear", where)
	}
}

// checkReviewer requires a server in kubernetes mode to run as its own ServiceAccount,
// with its token mounted and allowed to create TokenReviews and SubjectAccessReviews.
func checkReviewer(t *testing.T, objs []*unstructured.Unstructured, rbac *rbacReviews, s server) {
	t.Helper()
	where := "Deployment " + s.d.Name
	spec := s.d.Spec.Template.Spec
	sa := spec.ServiceAccountName
	if sa == "" || sa == "default" {
		t.Errorf("%s: reviews tokens as ServiceAccount %q; want its own", where, sa)
		return
	}
	if spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken false: it could not call TokenReview", where)
	}
	if u := find(t, objs, "ServiceAccount", sa, nil); u != nil {
		if v, ok, _ := unstructured.NestedBool(u.Object, "automountServiceAccountToken"); ok && !v && spec.AutomountServiceAccountToken == nil {
			t.Errorf("%s: ServiceAccount %s does not mount its token", where, sa)
		}
	}
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: s.d.Namespace}
	if !rbac.allowed(subject, "", "authentication.k8s.io", "tokenreviews", "create") || !rbac.allowed(subject, "", "authorization.k8s.io", "subjectaccessreviews", "create") {
		t.Errorf("%s: ServiceAccount %s/%s may not create TokenReviews and SubjectAccessReviews: it is not bound to system:auth-delegator", where, s.d.Namespace, sa)
	}
}

// checkExecutorCredentials requires the executor's serviceTokenFile to be a projected
// token of its ServiceAccount for the servers' audience, and its serviceCAFile the CA of
// the servers' certificates; and its ServiceAccount to be allowed what it calls.
func checkExecutorCredentials(t *testing.T, objs []*unstructured.Unstructured, rbac *rbacReviews, d appsv1.Deployment, c corev1.Container, tokenFile, caFile string) {
	t.Helper()
	spec := d.Spec.Template.Spec
	audiences := map[string]bool{}
	var issuers []string
	for _, s := range serversOf(t, objs) {
		audiences[cmp.Or(s.args["auth-audience"], auth.DefaultAudience)] = true
		if secret, _, ok := secretFile(s.d.Spec.Template.Spec, s.c, s.args["tls-cert-file"]); ok {
			if cert := certificateOf(objs, secret); cert != nil {
				issuers = append(issuers, issuerOf(cert))
			}
		}
	}
	if tokenFile == "" || caFile == "" {
		t.Errorf("executor config: serviceTokenFile %q, serviceCAFile %q: want both, since the services want a token and serve TLS from a private CA", tokenFile, caFile)
		return
	}

	v, rel, ok := volumeFile(spec, c, tokenFile)
	var token *corev1.ServiceAccountTokenProjection
	if ok && v.Projected != nil {
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil && src.ServiceAccountToken.Path == rel {
				token = src.ServiceAccountToken
			}
		}
	}
	switch {
	case token == nil:
		t.Errorf("executor: serviceTokenFile %s is no projected ServiceAccount token", tokenFile)
	case len(audiences) != 1 || !audiences[token.Audience]:
		t.Errorf("executor: its token's audience is %q; the services want %v", token.Audience, audiences)
	case token.ExpirationSeconds == nil || *token.ExpirationSeconds > 24*3600:
		t.Errorf("executor: its token expires after %v s: want an hour or so, renewed by the kubelet", deref(token.ExpirationSeconds))
	}

	secret, key, ok := secretFile(spec, c, caFile)
	cert := certificateOf(objs, secret)
	switch {
	case !ok || key != "ca.crt":
		t.Errorf("executor: serviceCAFile %s is not the ca.crt of a Secret volume (key %q of %q)", caFile, key, secret)
	case cert == nil:
		t.Errorf("executor: serviceCAFile comes from Secret %s, which no Certificate writes", secret)
	case slices.ContainsFunc(issuers, func(i string) bool { return i != issuerOf(cert) }):
		t.Errorf("executor: serviceCAFile is the CA of %s; the services' certificates come from %v", issuerOf(cert), issuers)
	}

	// What it calls, granted to its ServiceAccount in every project's namespace.
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: spec.ServiceAccountName, Namespace: d.Namespace}
	for _, want := range [][3]string{
		{"events.flyte.org", "events", "create"}, {"cache.flyte.org", "entries", "get"},
		{"cache.flyte.org", "entries", "create"}, {"cache.flyte.org", "reservations", "update"},
	} {
		if !rbac.allowed(subject, "team-a", want[0], want[1], want[2]) {
			t.Errorf("executor: ServiceAccount %s may not %s %s.%s, which it calls", spec.ServiceAccountName, want[2], want[1], want[0])
		}
	}
}

func issuerOf(cert *unstructured.Unstructured) string {
	kind, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "kind")
	name, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	return cmp.Or(kind, "Issuer") + "/" + name
}

// checkIssuers requires every Certificate's issuer to be rendered or left to the operator.
func checkIssuers(t *testing.T, objs []*unstructured.Unstructured, external []string) {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == "Certificate" {
			kind, name, _ := strings.Cut(issuerOf(u), "/")
			find(t, objs, kind, name, external)
		}
	}
}

// volumeFile finds the volume a file in container c comes from, and its path inside it.
func volumeFile(spec corev1.PodSpec, c corev1.Container, file string) (corev1.Volume, string, bool) {
	for _, m := range c.VolumeMounts {
		dir := path.Clean(m.MountPath)
		if m.SubPath != "" || !strings.HasPrefix(file, dir+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name {
				return v, strings.TrimPrefix(file, dir+"/"), true
			}
		}
	}
	return corev1.Volume{}, "", false
}

// secretFile finds the Secret and key a file in container c comes from.
func secretFile(spec corev1.PodSpec, c corev1.Container, file string) (secret, key string, ok bool) {
	v, rel, ok := volumeFile(spec, c, file)
	if !ok {
		return "", "", false
	}
	find := func(name string, items []corev1.KeyToPath) (string, string, bool) {
		if len(items) == 0 {
			return name, rel, true
		}
		for _, item := range items {
			if item.Path == rel {
				return name, item.Key, true
			}
		}
		return "", "", false
	}
	switch {
	case v.Secret != nil:
		return find(v.Secret.SecretName, v.Secret.Items)
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			if src.Secret != nil {
				if name, key, ok := find(src.Secret.Name, src.Secret.Items); ok {
					return name, key, true
				}
			}
		}
	}
	return "", "", false
}

// A peer of the traffic a NetworkPolicy check asks about.
type peer struct {
	namespace string
	nsLabels  map[string]string
	labels    map[string]string
}

func ns(name string, l map[string]string) map[string]string {
	out := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range l {
		out[k] = v
	}
	return out
}

// checkNetworkPolicies asks the rendered NetworkPolicies, as a network plugin would
// read them, who may reach each port of the servers and the executor: the executor and
// viewers' namespaces the RPC ports, monitoring namespaces the metrics, nobody else.
func checkNetworkPolicies(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var policies []networkingv1.NetworkPolicy
	for _, u := range objs {
		if u.GetKind() == "NetworkPolicy" {
			var p networkingv1.NetworkPolicy
			convert(t, u, &p)
			policies = append(policies, p)
		}
	}
	var exec appsv1.Deployment
	convert(t, must(t, objs, "Deployment", "executor"), &exec)
	home := exec.Namespace
	executor := peer{home, ns(home, nil), exec.Spec.Template.Labels}
	sameNamespace := peer{home, ns(home, nil), map[string]string{"app.kubernetes.io/name": "postgres"}}
	viewer := peer{"team-a", ns("team-a", map[string]string{"flyte.org/viewer-access": "true"}), map[string]string{"app": "cli"}}
	stranger := peer{"team-b", ns("team-b", nil), map[string]string{"app": "cli"}}
	monitoring := peer{"monitoring", ns("monitoring", map[string]string{"flyte.org/metrics-access": "true"}), map[string]string{"app": "prometheus"}}
	ingress := peer{"ingress-nginx", ns("ingress-nginx", map[string]string{"flyte.org/console-access": "true"}), map[string]string{"app": "controller"}}

	type want struct {
		from    peer
		name    string
		allowed bool
	}
	check := func(d appsv1.Deployment, portName string, wants []want) {
		t.Helper()
		tmpl := d.Spec.Template
		p := port(tmpl.Spec, portName)
		if p == 0 {
			t.Errorf("Deployment %s has no port %s", d.Name, portName)
			return
		}
		to := peer{d.Namespace, ns(d.Namespace, nil), tmpl.Labels}
		for _, w := range wants {
			if got := admits(policies, to, portName, p, w.from); got != w.allowed {
				t.Errorf("NetworkPolicies: %s may reach Deployment %s port %s: %v, want %v", w.name, d.Name, portName, got, w.allowed)
			}
		}
	}
	for _, s := range serversOf(t, objs) {
		check(s.d, "rpc", []want{
			{executor, "the executor", true}, {viewer, "a namespace labelled for viewers", true},
			{sameNamespace, "another pod of " + home, false}, {stranger, "an unlabelled namespace", false},
			{monitoring, "a namespace labelled for monitoring", false},
		})
		check(s.d, "metrics", []want{
			{monitoring, "a namespace labelled for monitoring", true}, {executor, "the executor", false},
			{viewer, "a namespace labelled for viewers", false}, {stranger, "an unlabelled namespace", false},
		})
		if s.args["console-listen"] != "" {
			check(s.d, "console", []want{
				{ingress, "a namespace labelled for the console's ingress", true}, {viewer, "a namespace labelled for viewers", false},
				{stranger, "an unlabelled namespace", false}, {sameNamespace, "another pod of " + home, false},
			})
		}
	}
	check(exec, "metrics", []want{
		{monitoring, "a namespace labelled for monitoring", true}, {viewer, "a namespace labelled for viewers", false},
		{stranger, "an unlabelled namespace", false}, {sameNamespace, "another pod of " + home, false},
	})
	check(exec, "health", []want{{stranger, "an unlabelled namespace", false}, {monitoring, "a namespace labelled for monitoring", false}})
}

// admits says whether traffic from a peer reaches a pod's port under the policies:
// allowed when no policy isolates the pod for ingress, otherwise only as some rule of
// a policy selecting it lets in.
func admits(policies []networkingv1.NetworkPolicy, to peer, portName string, portNumber int32, from peer) bool {
	isolated := false
	for _, p := range policies {
		if p.Namespace != to.namespace || !matches(&p.Spec.PodSelector, to.labels) {
			continue
		}
		if len(p.Spec.PolicyTypes) > 0 && !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, rp := range rule.Ports {
				if rp.Protocol != nil && *rp.Protocol != corev1.ProtocolTCP {
					continue
				}
				switch {
				case rp.Port == nil:
					portOK = true
				case rp.Port.Type == intstr.String && rp.Port.StrVal == portName:
					portOK = true
				case rp.Port.Type == intstr.Int && rp.Port.IntVal == portNumber:
					portOK = true
				}
			}
			fromOK := len(rule.From) == 0
			for _, f := range rule.From {
				switch {
				case f.IPBlock != nil:
					// Addresses, not pods: not what these checks ask about.
				case f.NamespaceSelector == nil:
					fromOK = fromOK || (from.namespace == p.Namespace && matches(f.PodSelector, from.labels))
				case f.PodSelector == nil:
					fromOK = fromOK || matches(f.NamespaceSelector, from.nsLabels)
				default:
					fromOK = fromOK || (matches(f.NamespaceSelector, from.nsLabels) && matches(f.PodSelector, from.labels))
				}
			}
			if portOK && fromOK {
				return true
			}
		}
	}
	return !isolated
}

func matches(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}
