package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/deploy/imagebuild"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/test/nodetest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/repo"
)

// What the node overlay (deploy/kustomize/overlays/node) expects of the deployment.
const (
	nodeOverlay      = "deploy/kustomize/overlays/node"
	deployNamespace  = "flyte"
	deployFieldOwner = "flyte-deploy-node"
	// nodeDataDir is the overlay's hostPath for the actions' data: the directory the
	// base's storage.allowedPrefixes names inside the executor's pod.
	nodeDataDir = "/tmp/flyte"
	// imageRepository and imageTag name the images make images builds, which the
	// overlay's images: section selects.
	imageRepository = "ghcr.io/flytekube"
	imageTag        = "dev"
	// deployedEvents is where the events service listens on the node (the overlay's
	// --listen); its certificate names events.
	deployedEvents = "https://127.0.0.1:8090"
	// programUID owns what the programs write (imagebuild.User).
	programUID = 65532
)

// deployments are the overlay's Deployments, in the order a rolling restart takes them.
var deployments = []string{"events", "cacheservice", "executor"}

// DeployOptions shape Deploy.
type DeployOptions struct {
	// Node is a running node to deploy onto; nil starts one (as root), stopped at the end.
	Node *nodetest.Node
	// Timeout bounds each wait: a rollout, the examples.
	Timeout time.Duration
	// RollingRestart, once the examples have ended, restarts each Deployment in turn
	// while new actions run, and checks that none of their events was lost.
	RollingRestart bool
	// Hold keeps the deployment running until ctx ends (make deploy-node); otherwise
	// Deploy returns once it has checked what it ran, and takes the deployment down.
	Hold bool
}

// Deploy runs the shipped manifests, through the node overlay, on a real node: it
// builds the images and imports them into the node's containerd, starts a Postgres on
// 127.0.0.1, makes what production makes by hand (the database Secret, the services'
// TLS Secrets, here from a CA made for the run), applies the overlay, waits for the
// three Deployments to roll out with their probes passing, runs examples/ through the
// executor in its pod and checks each example's end and every one of its events in the
// events service, read as a project's viewer with a ServiceAccount token.
func Deploy(ctx context.Context, o DeployOptions, out io.Writer) (err error) {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	if os.Geteuid() != 0 {
		return errors.New("sandbox: deploying onto a node needs root (containerd and the kubelet)")
	}
	root, err := repo.Root()
	if err != nil {
		return err
	}
	scheme, err := executor.Scheme()
	if err != nil {
		return err
	}
	node := o.Node
	if node == nil {
		say("starting a real single-node Kubernetes on 127.0.0.1 (hack/node.sh; built the first time)")
		if node, err = nodetest.Start(nodetest.Options{Scheme: scheme}); err != nil {
			return err
		}
		stops = append(stops, func() { _ = node.Stop() })
	}
	c, err := client.NewWithWatch(node.Config, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}

	pgPort, err := ports.Free(1)
	if err != nil {
		return err
	}
	say("starting Postgres on 127.0.0.1:%d (hack/postgres.sh)", pgPort[0])
	pg, err := pgtest.StartOnPort(pgPort[0])
	if err != nil {
		return err
	}
	stops = append(stops, func() { _ = pg.Stop() })
	dbURL, err := database(ctx, pg.URL)
	if err != nil {
		return err
	}

	say("building the images (make images) and importing them into the node's containerd")
	if err := importImages(ctx, root, node.Dir); err != nil {
		return err
	}

	say("rendering %s", nodeOverlay)
	objs, err := renderOverlay(ctx, root)
	if err != nil {
		return err
	}
	creds, err := devcreds.Ensure(filepath.Join(node.Dir, "deploy-credentials"), serviceNames()...)
	if err != nil {
		return err
	}
	made, err := madeAtDeployTime(node.Config.Host, dbURL, creds)
	if err != nil {
		return err
	}
	say("applying it: %d objects, and the Secrets and ConfigMap made here", len(objs))
	if !o.Hold && o.Node != nil {
		// The node outlives this call: leave it as found, or the executor would go on
		// reconciling every namespace's actions.
		stops = append(stops, func() { teardown(c, objs, out) })
	}
	// The overlay mounts it with type Directory: a hostPath the kubelet would make is
	// root's alone.
	if err := os.MkdirAll(nodeDataDir, 0o755); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := applyAll(ctx, c, objs, made); err != nil {
		return err
	}
	if err := waitRollouts(ctx, c, o.Timeout); err != nil {
		return err
	}
	say("the executor, events and cacheservice Deployments rolled out; their probes pass")

	viewer, err := viewerClient(ctx, c, node.Dir, creds.CAFile)
	if err != nil {
		return err
	}
	if err := refusesWithoutToken(ctx, creds.CAFile); err != nil {
		return err
	}
	examples, err := loadExamples(filepath.Join(root, "examples"))
	if err != nil {
		return err
	}
	examples, _ = withoutSecondCluster(examples) // one cluster here
	// The examples' data goes under the prefix the base's executor configuration allows
	// for their project and domain, in the node's data directory.
	data := filepath.Join(nodeDataDir, demoNamespace, "development")
	if err := os.RemoveAll(data); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	for _, d := range []string{"inputs", "outputs"} {
		if err := os.MkdirAll(filepath.Join(data, d), 0o755); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	if _, err := prepareExamples(ctx, c, root, data, examples); err != nil {
		return err
	}
	if err := chownTree(filepath.Join(nodeDataDir, demoNamespace), programUID); err != nil {
		return err
	}
	say("applying %d TaskActions from examples/ to namespace %s", len(examples), demoNamespace)
	if err := apply(ctx, c, examples); err != nil {
		return err
	}
	if err := watchExamples(ctx, []client.WithWatch{c}, examples, Options{UntilSettled: true, Timeout: o.Timeout}, Endpoints{}, out,
		func(ctx context.Context) error {
			return eventually(ctx, o.Timeout, func(ctx context.Context) []string {
				return checkEvents(ctx, c, viewer, createdActions(examples))
			})
		}); err != nil {
		return err
	}
	say("every example's history is in the events service, each entry once")

	if o.RollingRestart {
		if err := rollingRestart(ctx, c, viewer, o.Timeout, say); err != nil {
			return err
		}
	}
	if o.Hold {
		// The pods' output is read from the kubelet's files: the API server's log proxy
		// would reach the node at its address, which is not the loopback.
		say("\nrunning; Ctrl-C stops it all. As the cluster's administrator (the API server alone):\n  export KUBECONFIG=%s\n  kubectl -n flyte get pods\n  kubectl -n demo get taskactions\nEach pod's output is a file under %s (tail it there)",
			filepath.Join(node.Dir, "admin.kubeconfig"), filepath.Join(node.Dir, "kubelet", "pod-logs"))
		<-ctx.Done()
	}
	return nil
}

// serviceNames are the names the services' certificate covers: those cert-manager's
// Certificates give them (components/cert-manager), which the executor calls.
func serviceNames() []string {
	var names []string
	for _, svc := range []string{"events", "cacheservice"} {
		names = append(names, svc, svc+".flyte", svc+".flyte.svc", svc+".flyte.svc.cluster.local")
	}
	return names
}

// importImages builds the three images as make images does (tagged with the checkout's
// version and with imageTag, the binaries stamped with the version) and imports them into
// the node's containerd, where the kubelet finds them without a pull.
func importImages(ctx context.Context, root, nodeDir string) error {
	dir := filepath.Join(nodeDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	version, commit := buildinfo.Describe(ctx, root)
	for _, p := range imagebuild.Programs {
		img, err := imagebuild.Build(ctx, p, imagebuild.Options{Root: root, Version: version, Revision: commit})
		if err != nil {
			return err
		}
		refs := map[name.Reference]v1.Image{}
		var ref name.Tag
		for _, tag := range []string{version, imageTag} {
			if ref, err = name.NewTag(imageRepository + "/" + p.Name + ":" + tag); err != nil {
				return fmt.Errorf("sandbox: %w", err)
			}
			refs[ref] = img
		}
		archive := filepath.Join(dir, p.Name+".tar")
		if err := tarball.MultiRefWriteToFile(archive, refs); err != nil {
			return fmt.Errorf("sandbox: writing %s: %w", archive, err)
		}
		if out, err := exec.CommandContext(ctx, "ctr", "--address", filepath.Join(nodeDir, "containerd", "containerd.sock"),
			"-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
			return fmt.Errorf("sandbox: importing %s: %w\n%s", ref, err, out)
		}
	}
	return nil
}

// renderOverlay renders the node overlay with the kustomize the tests use.
func renderOverlay(ctx context.Context, root string) ([]*unstructured.Unstructured, error) {
	cmd := exec.CommandContext(ctx, "go", "tool", "-modfile=tools/go.mod", "kustomize", "build", nodeOverlay)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("sandbox: kustomize build %s: %w\n%s", nodeOverlay, err, stderr.String())
	}
	return decodeManifests(raw)
}

// madeAtDeployTime are the objects the overlay expects to find, made as production
// makes them by hand (deploy/README.md): the database Secret, the services' TLS Secrets
// (cert-manager's, in production) and the API server's port.
func madeAtDeployTime(apiServer, dbURL string, creds *devcreds.Credentials) ([]client.Object, error) {
	u, err := url.Parse(apiServer)
	if err != nil {
		return nil, fmt.Errorf("sandbox: the API server's address: %w", err)
	}
	files := map[string][]byte{}
	for _, f := range []string{creds.CertFile, creds.KeyFile, creds.CAFile} {
		if files[f], err = os.ReadFile(f); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "flyte-database", Namespace: deployNamespace},
			StringData: map[string]string{"url": dbURL}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "node-apiserver", Namespace: deployNamespace},
			Data: map[string]string{"port": u.Port()}},
	}
	for _, svc := range []string{"events", "cacheservice"} {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: svc + "-tls", Namespace: deployNamespace},
			Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": files[creds.CertFile], "tls.key": files[creds.KeyFile], "ca.crt": files[creds.CAFile]}})
	}
	return objs, nil
}

// applyAll applies the rendered objects with server-side apply: the namespaces first,
// then what is made here, then the rest.
func applyAll(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, made []client.Object) error {
	ssa := func(obj *unstructured.Unstructured) error {
		if err := c.Patch(ctx, obj.DeepCopy(), client.Apply, client.FieldOwner(deployFieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("sandbox: applying %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		return nil
	}
	for _, obj := range objs {
		if obj.GetKind() == "Namespace" {
			if err := ssa(obj); err != nil {
				return err
			}
		}
	}
	for _, obj := range made {
		if err := c.Create(ctx, obj); err != nil {
			if !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("sandbox: making %s: %w", obj.GetName(), err)
			}
			if err := c.Update(ctx, obj); err != nil {
				return fmt.Errorf("sandbox: making %s: %w", obj.GetName(), err)
			}
		}
	}
	for _, obj := range objs {
		if obj.GetKind() != "Namespace" {
			if err := ssa(obj); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitRollouts waits until each Deployment runs its current template alone, every pod
// ready, none restarted: the probes pass and keep passing.
func waitRollouts(ctx context.Context, c client.Client, timeout time.Duration) error {
	for _, name := range deployments {
		var last string
		err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
			var d appsv1.Deployment
			if err := c.Get(ctx, client.ObjectKey{Namespace: deployNamespace, Name: name}, &d); err != nil {
				last = err.Error()
				return false, nil
			}
			want := int32(1)
			if d.Spec.Replicas != nil {
				want = *d.Spec.Replicas
			}
			st := d.Status
			last = fmt.Sprintf("%d of %d updated, %d available, %d in all", st.UpdatedReplicas, want, st.AvailableReplicas, st.Replicas)
			return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == want && st.AvailableReplicas == want && st.Replicas == want, nil
		})
		if err != nil {
			return fmt.Errorf("sandbox: Deployment %s did not roll out within %s (%s); its pods: %s", name, timeout, last, podStates(ctx, c, name))
		}
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(deployNamespace)); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount > 0 && p.DeletionTimestamp.IsZero() {
				return fmt.Errorf("sandbox: pod %s restarted %d times (a failing liveness probe?)", p.Name, s.RestartCount)
			}
		}
	}
	return nil
}

// podStates says why a Deployment's pods are not ready, for an error.
func podStates(ctx context.Context, c client.Client, app string) string {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(deployNamespace), client.MatchingLabels{"app.kubernetes.io/name": app}); err != nil {
		return err.Error()
	}
	var states []string
	for _, p := range pods.Items {
		s := p.Name + " " + string(p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			switch {
			case cs.State.Waiting != nil:
				s += fmt.Sprintf(" waiting: %s %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
			case cs.State.Terminated != nil:
				s += fmt.Sprintf(" terminated: %s (exit %d)", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
			default:
				s += fmt.Sprintf(" ready=%v restarts=%d", cs.Ready, cs.RestartCount)
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Status != corev1.ConditionTrue && cond.Message != "" {
				s += fmt.Sprintf(" %s: %s", cond.Type, cond.Message)
			}
		}
		states = append(states, s)
	}
	if len(states) == 0 {
		return "none"
	}
	return strings.Join(states, "; ")
}

// chownTree gives dir and everything in it to uid: the executor runs as the programs'
// user and writes the actions' outputs there.
func chownTree(dir string, uid int) error {
	err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(path, uid, uid)
	})
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	return nil
}

// createdActions are the examples the API server accepted.
func createdActions(examples []*example) []*flytev1.TaskAction {
	var out []*flytev1.TaskAction
	for _, e := range examples {
		if e.applied && e.rejected == nil {
			out = append(out, e.action)
		}
	}
	return out
}

// teardown deletes what Deploy applied but the CRD (the node's other users' actions
// need it), the task namespace first, while the executor can still let its actions go.
func teardown(c client.Client, objs []*unstructured.Unstructured, out io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, ns := range []string{demoNamespace, deployNamespace} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintf(out, "taking the deployment down: %v\n", err)
		}
		if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(obj), obj)), nil
		}); err != nil {
			fmt.Fprintf(out, "taking the deployment down: namespace %s is still there\n", ns)
		}
	}
	for _, obj := range objs {
		if obj.GetNamespace() != "" || obj.GetKind() == "CustomResourceDefinition" || obj.GetKind() == "Namespace" {
			continue
		}
		if err := c.Delete(ctx, obj.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintf(out, "taking the deployment down: %v\n", err)
		}
	}
}

// rollingRestart restarts each Deployment in turn, as kubectl rollout restart does,
// while actions keep coming, and then checks that every event of every one of them
// reached the events service once.
func rollingRestart(ctx context.Context, c client.Client, viewer eventsClient, timeout time.Duration, say func(string, ...any)) error {
	var created []*flytev1.TaskAction
	next := 0
	create := func(n int) error {
		for range n {
			ta := restartAction(next)
			next++
			if err := c.Create(ctx, ta); err != nil {
				return fmt.Errorf("sandbox: %w", err)
			}
			created = append(created, ta)
		}
		return nil
	}
	leaseBefore, err := leaseHolder(ctx, c)
	if err != nil {
		return err
	}
	for _, name := range deployments {
		say("restarting %s, with actions running", name)
		if err := create(4); err != nil {
			return err
		}
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKey{Namespace: deployNamespace, Name: name}, &d); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		patch := client.MergeFrom(d.DeepCopy())
		if d.Spec.Template.Annotations == nil {
			d.Spec.Template.Annotations = map[string]string{}
		}
		d.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = time.Now().Format(time.RFC3339Nano)
		if err := c.Patch(ctx, &d, patch); err != nil {
			return fmt.Errorf("sandbox: restarting %s: %w", name, err)
		}
		// Actions arrive while the old pod stops and the new one starts.
		if err := create(4); err != nil {
			return err
		}
		if err := waitRollouts(ctx, c, timeout); err != nil {
			return err
		}
		if err := create(4); err != nil {
			return err
		}
	}
	leaseAfter, err := leaseHolder(ctx, c)
	if err != nil {
		return err
	}
	if leaseAfter == leaseBefore {
		return fmt.Errorf("sandbox: the executor's Lease is still held by %s, the pod the restart replaced", leaseBefore)
	}
	say("all three restarted; the new executor holds the Lease (%s); waiting for the %d actions to end", leaseAfter, len(created))
	return eventually(ctx, timeout, func(ctx context.Context) []string {
		var problems []string
		for _, ta := range created {
			var got flytev1.TaskAction
			if err := c.Get(ctx, client.ObjectKeyFromObject(ta), &got); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", ta.Name, err))
				continue
			}
			if got.Status.Phase != flytev1.PhaseSucceeded {
				problems = append(problems, fmt.Sprintf("%s is %s", ta.Name, cmp.Or(string(got.Status.Phase), "new")))
			}
		}
		if len(problems) > 0 {
			return problems
		}
		return checkEvents(ctx, c, viewer, created)
	})
}

// restartAction is the i-th action of the rolling restart: a short sleep.
func restartAction(i int) *flytev1.TaskAction {
	name := "restart-" + strconv.Itoa(i)
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace},
		Spec: flytev1.TaskActionSpec{Project: demoNamespace, Domain: "development", RunName: "restart", ActionName: name,
			TaskName: "demo.sleepy", TaskType: "core-sleep", RunOutputBase: "file://" + nodeDataDir + "/demo/development/outputs/restart",
			Config: map[string]string{"duration": "2s"}},
	}
}

// leaseHolder is who holds the executor's leader-election Lease.
func leaseHolder(ctx context.Context, c client.Client) (string, error) {
	var lease coordinationv1.Lease
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: deployNamespace, Name: "abf369a8.flyte.org"}, &lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("sandbox: nobody holds the executor's Lease: %w", err)
	}
	return *lease.Spec.HolderIdentity, nil
}

// eventually runs check until it finds nothing wrong or timeout passes, and returns
// what it found last.
func eventually(ctx context.Context, timeout time.Duration, check func(context.Context) []string) error {
	var problems []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		problems = check(ctx)
		return len(problems) == 0, nil
	})
	if err != nil {
		slices.Sort(problems)
		return fmt.Errorf("sandbox: after %s: %s", timeout, strings.Join(bounded(problems, 10), "; "))
	}
	return nil
}

// viewerClient calls the events service as a team that reads its runs would
// (docs/security.md): a ServiceAccount of namespace demo bound to flyte-services-viewer
// there, with a token for audience flyte from the TokenRequest API.
func viewerClient(ctx context.Context, c client.Client, dir, caFile string) (eventsClient, error) {
	const name = "deploy-check"
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "flyte-services-viewer"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: demoNamespace}}},
	}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("sandbox: making the viewer: %w", err)
		}
	}
	expiry := int64(3600)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"flyte"}, ExpirationSeconds: &expiry}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return nil, fmt.Errorf("sandbox: a token for the viewer: %w", err)
	}
	tokenFile := filepath.Join(dir, "deploy-credentials", "viewer-sa.token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return newEventsClient(caFile, tokenFile)
}
