package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/authbench"
	"github.com/flytekube/backend/test/metricstest"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// services are both services running with TLS and one auth configuration.
type services struct {
	pki                 *servicetest.PKI
	events, cache       *servicetest.Instance
	eventsURL, cacheURL string
}

func startServices(t *testing.T, pg *pgtest.Server, authCfg auth.Config, client kubernetes.Interface) *services {
	t.Helper()
	pki := servicetest.NewPKI(t)
	srv := pki.ServerConfig()
	ev := servicetest.Run(t, events.Run, events.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t),
		Server: srv, Auth: authCfg, KubeClient: client})
	ca := servicetest.Run(t, cacheservice.Run, cacheservice.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", DatabaseURL: pg.NewDatabase(t),
		Server: srv, Auth: authCfg, KubeClient: client})
	return &services{pki: pki, events: ev, cache: ca,
		eventsURL: strings.Replace(ev.URL, "http://", "https://", 1), cacheURL: strings.Replace(ca.URL, "http://", "https://", 1)}
}

// rpc is one call of one RPC in one project.
type rpc struct {
	name string
	read bool
	call func(ctx context.Context, s *services, httpClient *http.Client, opts []connect.ClientOption, project string) error
}

// clusterWide says the RPC is the CloudEvents egress's, granted cluster-wide only.
func (r rpc) clusterWide() bool { return strings.HasPrefix(r.name, "egress.") }

func evClient(s *services, c *http.Client, opts []connect.ClientOption) eventsv1connect.EventsServiceClient {
	return eventsv1connect.NewEventsServiceClient(c, s.eventsURL, opts...)
}

func cacheClient(s *services, c *http.Client, opts []connect.ClientOption) cachev1connect.CacheServiceClient {
	return cachev1connect.NewCacheServiceClient(c, s.cacheURL, opts...)
}

func authActionID(project string) *flytecorev1.ActionIdentifier {
	return &flytecorev1.ActionIdentifier{Project: project, Domain: "development", Run: "r1", Action: "a1"}
}

func authCacheKey(project string) *cachev1.CacheKey {
	return &cachev1.CacheKey{Project: project, Domain: "development", TaskName: "t", CacheVersion: "1", Signature: "s", InputsHash: "h"}
}

// ignoreNotFound treats the answers an allowed caller may get as success.
func ignoreNotFound(err error) error {
	if c := connect.CodeOf(err); c == connect.CodeNotFound || c == connect.CodeAlreadyExists {
		return nil
	}
	return err
}

var rpcs = []rpc{
	{"Record", false, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := evClient(s, c, o).Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{{
			Id: authActionID(p), Attempt: 1, Phase: flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, OccurredAt: timestamppb.Now(),
		}}}))
		return err
	}},
	{"GetAction", true, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := evClient(s, c, o).GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: authActionID(p)}))
		return ignoreNotFound(err)
	}},
	{"ListActions", true, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := evClient(s, c, o).ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: p, Domain: "development"}))
		return err
	}},
	{"ListActionEvents", true, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := evClient(s, c, o).ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: authActionID(p)}))
		return err
	}},
	{"WatchActions", true, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		// An allowed watch stays open with nothing to say, so it ends by our deadline.
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		stream, err := evClient(s, c, o).WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: p, Domain: "development"}))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		defer func() { _ = stream.Close() }()
		for stream.Receive() {
		}
		// The deadline travels with the call, so the server may end it first.
		if err := stream.Err(); err != nil && ctx.Err() == nil && connect.CodeOf(err) != connect.CodeDeadlineExceeded {
			return err
		}
		return nil
	}},
	{"cache.Get", true, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := cacheClient(s, c, o).Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: authCacheKey(p)}))
		return ignoreNotFound(err)
	}},
	{"cache.Put", false, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := cacheClient(s, c, o).Put(ctx, connect.NewRequest(&cachev1.PutRequest{Key: authCacheKey(p), SourceAction: authActionID(p), SourceAttempt: 1}))
		return ignoreNotFound(err)
	}},
	{"cache.Delete", false, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := cacheClient(s, c, o).Delete(ctx, connect.NewRequest(&cachev1.DeleteRequest{Key: authCacheKey(p)}))
		return err
	}},
	{"cache.Invalidate", false, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := cacheClient(s, c, o).Invalidate(ctx, connect.NewRequest(&cachev1.InvalidateRequest{Project: p, Domain: "development", TaskName: "t"}))
		return err
	}},
	{"cache.GetOrExtendReservation", false, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := cacheClient(s, c, o).GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{
			Key: authCacheKey(p), OwnerId: "owner", HeartbeatInterval: durationpb.New(5 * time.Second)}))
		return err
	}},
	{"cache.ReleaseReservation", false, func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, p string) error {
		_, err := cacheClient(s, c, o).ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: authCacheKey(p), OwnerId: "owner"}))
		return err
	}},
	// The CloudEvents egress is cluster-wide: the project does not matter.
	{name: "egress.ListSinks", read: true, call: func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, _ string) error {
		_, err := egressClient(s, c, o).ListSinks(ctx, connect.NewRequest(&eventsv1.ListSinksRequest{}))
		return err
	}},
	{name: "egress.ListDeadLetters", read: true, call: func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, _ string) error {
		_, err := egressClient(s, c, o).ListDeadLetters(ctx, connect.NewRequest(&eventsv1.ListDeadLettersRequest{}))
		return err
	}},
	{name: "egress.ReplayDeadLetters", call: func(ctx context.Context, s *services, c *http.Client, o []connect.ClientOption, _ string) error {
		_, err := egressClient(s, c, o).ReplayDeadLetters(ctx, connect.NewRequest(&eventsv1.ReplayDeadLettersRequest{Sink: "nowhere", All: true}))
		return err
	}},
}

func egressClient(s *services, c *http.Client, opts []connect.ClientOption) eventsv1connect.EgressServiceClient {
	return eventsv1connect.NewEgressServiceClient(c, s.eventsURL, opts...)
}

// projectWide: allowed but for the cluster-wide egress RPCs, which the executor's
// ClusterRole does not grant.
func projectWide(r rpc) connect.Code {
	if r.clusterWide() {
		return connect.CodePermissionDenied
	}
	return 0
}

// egressOnly: the egress RPCs and nothing else, as flyte-services-egress-operator grants.
func egressOnly(r rpc) connect.Code {
	if r.clusterWide() {
		return 0
	}
	return connect.CodePermissionDenied
}

var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
}

// caller is one identity and what it may do.
type caller struct {
	name  string
	token string
	// want is the code expected of an RPC, or 0 when it must be allowed.
	want func(r rpc) connect.Code
}

func unauthenticated(rpc) connect.Code { return connect.CodeUnauthenticated }
func forbidden(rpc) connect.Code       { return connect.CodePermissionDenied }
func allowed(rpc) connect.Code         { return 0 }

// projectReadOnly: readOnly within a project; the egress needs a ClusterRoleBinding.
func projectReadOnly(r rpc) connect.Code {
	if r.clusterWide() {
		return connect.CodePermissionDenied
	}
	return readOnly(r)
}

func readOnly(r rpc) connect.Code {
	if r.read {
		return 0
	}
	return connect.CodePermissionDenied
}

// checkCallers calls every RPC as every caller over every protocol in project.
func checkCallers(t *testing.T, s *services, project string, callers []caller) {
	t.Helper()
	for _, p := range protocols {
		for _, c := range callers {
			client := s.pki.Client(c.token)
			for _, r := range rpcs {
				t.Run(fmt.Sprintf("%s/%s/%s/%s", project, p.name, c.name, r.name), func(t *testing.T) {
					err := r.call(context.Background(), s, client, p.opts, project)
					want := c.want(r)
					switch {
					case want == 0 && err != nil:
						t.Fatalf("want allowed, got %v", err)
					case want != 0 && connect.CodeOf(err) != want:
						t.Fatalf("want %v, got %v", want, err)
					}
					if want == connect.CodeUnauthenticated && strings.Contains(err.Error(), "token") && strings.Contains(err.Error(), c.token) && c.token != "" {
						t.Fatalf("the error repeats the token: %v", err)
					}
				})
			}
		}
	}
}

// checkDeniedWroteNothing: a refused Record left no trace, and refusals were counted.
func checkDeniedWroteNothing(t *testing.T, s *services, executorToken, deniedProject string) {
	t.Helper()
	_, err := evClient(s, s.pki.Client(executorToken), nil).GetAction(context.Background(),
		connect.NewRequest(&eventsv1.GetActionRequest{Id: authActionID(deniedProject)}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a refused Record wrote an action: GetAction says %v", err)
	}
	for _, inst := range []*servicetest.Instance{s.events, s.cache} {
		samples, err := metricstest.Samples(inst.Gatherer())
		if err != nil {
			t.Fatal(err)
		}
		for _, reason := range []model.LabelValue{"unauthenticated", "forbidden"} {
			var refused model.SampleValue
			for _, s := range samples {
				if s.Metric[model.MetricNameLabel] == "flyte_rpc_denied_total" && s.Metric["reason"] == reason {
					refused += s.Value
				}
			}
			if refused == 0 {
				t.Errorf("/metrics of %s counts no %s refusal", inst.URL, reason)
			}
		}
	}
}

// TestTokenFileModeAuthorizesEveryRPC: executors may call everything, viewers only the
// read RPCs of a project (not the cluster-wide egress, whose sinks and dead letters are
// every project's), operators the egress RPCs only, anyone else nothing, and no or a bad
// token is Unauthenticated, over Connect, gRPC and gRPC-Web with TLS.
func TestTokenFileModeAuthorizesEveryRPC(t *testing.T) {
	pg := pgtest.New(t)
	tokens := servicetest.NewTokens(t)
	operator := addToken(t, tokens.File, "operator", auth.Operators)
	s := startServices(t, pg, tokens.AuthConfig(), nil)
	s.events.RequireMetrics(t, `flyte_rpc_denied_total{procedure="/flyte.events.v1.EventsService/Record",reason="forbidden"} 0`)
	checkInventedPathsDoNotGrowTheMetric(t, s)
	checkCallers(t, s, "team-a", []caller{
		{"no-token", "", unauthenticated},
		{"bad-token", "not-a-token", unauthenticated},
		{"executor", tokens.Executor, allowed},
		{"viewer", tokens.Viewer, projectReadOnly},
		{"operator", operator, egressOnly},
		{"other", tokens.Other, forbidden},
	})
	checkCallers(t, s, "team-b", []caller{{"other", tokens.Other, forbidden}, {"viewer", tokens.Viewer, projectReadOnly}})
	checkDeniedWroteNothing(t, s, tokens.Executor, "team-b")
}

// addToken appends a caller in group to a token file and returns its token.
func addToken(t *testing.T, file, name, group string) string {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	token := hex.EncodeToString(b)
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "%s,%s,uid-%s,%q\n", token, name, name, group)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("adding %s to the token file: %v", name, err)
	}
	return token
}

// TestKubernetesModeAuthorizesEveryRPC checks ServiceAccount tokens with TokenReview and
// permissions with SubjectAccessReview against the shipped ClusterRoles: the executor
// may do everything, a viewer bound in one project's namespace may read that project
// only, a viewer bound to every project still may not call the cluster-wide egress,
// tokens for another audience or of a deleted ServiceAccount are refused.
func TestKubernetesModeAuthorizesEveryRPC(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	applyShippedRoles(t, cs)
	home := kube.Namespace(t)
	teamA, teamB := kube.Namespace(t), kube.Namespace(t)

	token := func(sa string, audience string) string {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts(home).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	for _, sa := range []string{"executor", "viewer", "every-project-viewer", "other", "gone", "egress-operator", "cache-check"} {
		if _, err := cs.CoreV1().ServiceAccounts(home).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind(t, cs, "", "flyte-services-executor", home, "executor")
	bind(t, cs, teamA, "flyte-services-viewer", home, "viewer")
	bind(t, cs, "", "flyte-services-viewer", home, "every-project-viewer")
	bind(t, cs, "", "flyte-services-egress-operator", home, "egress-operator")
	bind(t, cs, "", "flyte-services-executor", home, "cache-check")
	executor, viewer, other := token("executor", "flyte"), token("viewer", "flyte"), token("other", "flyte")
	operator := token("egress-operator", "flyte")
	everyProjectViewer := token("every-project-viewer", "flyte")
	wrongAudience := token("executor", "someone-else")
	revoked := token("gone", "flyte")
	if err := cs.CoreV1().ServiceAccounts(home).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	s := startServices(t, pg, auth.Config{Mode: auth.ModeKubernetes}, cs)
	checkCallers(t, s, teamA, []caller{
		{"no-token", "", unauthenticated},
		{"bad-token", "not-a-token", unauthenticated},
		{"wrong-audience", wrongAudience, unauthenticated},
		{"revoked", revoked, unauthenticated},
		{"executor", executor, projectWide},
		{"viewer", viewer, projectReadOnly},
		{"every-project-viewer", everyProjectViewer, projectReadOnly},
		{"other", other, forbidden},
		{"egress-operator", operator, egressOnly},
	})
	// A token and identity reviewed for the first time by the check: one reviewed a few
	// seconds before would expire from the caches during it.
	checkDecisionsAreCached(t, cs, s, token("cache-check", "flyte"), teamA)
	// The viewer's RoleBinding is in team A's namespace only.
	checkCallers(t, s, teamB, []caller{{"viewer", viewer, forbidden}, {"every-project-viewer", everyProjectViewer, projectReadOnly}, {"executor", executor, projectWide}})
	checkDeniedWroteNothing(t, s, executor, "no-such-project")
}

func bind(t *testing.T, cs kubernetes.Interface, namespace, clusterRole, saNamespace, sa string) {
	t.Helper()
	ctx := context.Background()
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: saNamespace}}
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole}
	meta := metav1.ObjectMeta{Name: saNamespace + "-" + sa}
	var err error
	if namespace == "" {
		_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
	} else {
		_, err = cs.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("binding %s to %s: %v", clusterRole, sa, err)
	}
}

// applyShippedRoles creates the ClusterRoles of deploy/kustomize/base/access, so the
// test checks what a cluster admin installs.
func applyShippedRoles(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	names, err := authbench.ApplyRoles(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"flyte-services-executor", "flyte-services-viewer", "flyte-services-egress-operator"}) {
		t.Fatalf("roles.yaml holds ClusterRoles %v, want the executor's, the viewer's and the egress operator's", names)
	}
}

// TestUnauthenticatedCallsAreRefusedBeforeTheirBody: a call without a token is answered
// while its body is still unsent, so an anonymous client cannot make the service hold
// its bytes or wait for them.
func TestUnauthenticatedCallsAreRefusedBeforeTheirBody(t *testing.T) {
	pg := pgtest.New(t)
	tokens := servicetest.NewTokens(t)
	s := startServices(t, pg, tokens.AuthConfig(), nil)
	body, never := io.Pipe() // nothing is ever written
	defer func() { _ = never.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.eventsURL+eventsv1connect.EventsServiceRecordProcedure, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := s.pki.Client("").Do(req)
	if err != nil {
		t.Fatalf("no answer while the body was pending: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	status := resp.Trailer.Get("Grpc-Status")
	if status == "" {
		status = resp.Header.Get("Grpc-Status")
	}
	if status != strconv.Itoa(int(connect.CodeUnauthenticated)) {
		t.Fatalf("grpc-status %q, want Unauthenticated (%d)", status, connect.CodeUnauthenticated)
	}
}

// checkInventedPathsDoNotGrowTheMetric: refusals of paths no RPC has are counted under
// one label value, so a caller without a token cannot add series at will.
func checkInventedPathsDoNotGrowTheMetric(t *testing.T, s *services) {
	t.Helper()
	for i := range 3 {
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/flyte.events.v1.EventsService/Invented%d", s.eventsURL, i), strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.pki.Client("").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("an invented path without a token: HTTP %d, want 401", resp.StatusCode)
		}
	}
	samples, err := metricstest.Samples(s.events.Gatherer())
	if err != nil {
		t.Fatal(err)
	}
	for _, sample := range samples {
		if strings.Contains(string(sample.Metric["procedure"]), "Invented") {
			t.Fatalf("/metrics has a series for an invented path: %s", sample.Metric)
		}
	}
	s.events.RequireMetrics(t, `flyte_rpc_denied_total{procedure="other",reason="unauthenticated"} 3`)
}

// checkDecisionsAreCached: once a caller has been reviewed, its calls cost the API server
// nothing: 200 cache Gets make no TokenReview and no SubjectAccessReview.
func checkDecisionsAreCached(t *testing.T, cs kubernetes.Interface, s *services, token, project string) {
	t.Helper()
	client := cacheClient(s, s.pki.Client(token), nil)
	get := func() {
		_, err := client.Get(context.Background(), connect.NewRequest(&cachev1.GetRequest{Key: authCacheKey(project)}))
		if ignoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	get() // reviewed now, if it was not already
	before := reviews(t, cs)
	if before == 0 {
		t.Fatal("the API server counts no reviews at all: this check would see nothing")
	}
	for range 200 {
		get()
	}
	if after := reviews(t, cs); after != before {
		t.Fatalf("200 Gets by a reviewed caller made %d reviews; want 0", after-before)
	}
}

// reviews counts the TokenReviews and SubjectAccessReviews the API server has answered.
func reviews(t *testing.T, cs kubernetes.Interface) int {
	t.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	samples, err := metricstest.Text(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range samples {
		m := s.Metric
		if m[model.MetricNameLabel] == "apiserver_request_total" && m["verb"] == "POST" &&
			(m["resource"] == "tokenreviews" || m["resource"] == "subjectaccessreviews") {
			n += int(s.Value)
		}
	}
	return n
}
