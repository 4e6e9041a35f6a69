package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// ClusterExtra is the key of user.Info's Extra that names the cluster a caller was
// authenticated by: its executor may record only that cluster's actions.
const ClusterExtra = "flyte.org/cluster"

// ClusterGroupPrefix binds a token-file identity to a cluster: a token whose groups hold
// "flyte:cluster:gpu-east" is gpu-east's.
const ClusterGroupPrefix = "flyte:cluster:"

// Cluster is one cluster whose ServiceAccount tokens a service accepts in kubernetes
// mode, beside the one Config.Kubeconfig reaches.
type Cluster struct {
	// Name is the cluster's name, as its executor's `cluster` setting spells it.
	Name string `json:"name"`
	// Issuer is the cluster's ServiceAccount token issuer (kube-apiserver's
	// --service-account-issuer; `kubectl get --raw /.well-known/openid-configuration`
	// shows it): a token's iss claim picks the cluster that reviews it.
	Issuer string `json:"issuer"`
	// Kubeconfig reaches the cluster's API server, for TokenReview and
	// SubjectAccessReview.
	Kubeconfig string `json:"kubeconfig"`
}

// ClustersFile is the file Config.ClustersFile names.
type ClustersFile struct {
	Clusters []Cluster `json:"clusters"`
}

// maxClusters bounds the clusters file: each is a client and two caches.
const maxClusters = 64

// readClusters reads and checks a clusters file.
func readClusters(path string) ([]Cluster, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth-clusters-file: %w", err)
	}
	var f ClustersFile
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return nil, fmt.Errorf("auth-clusters-file %s: %w", path, err)
	}
	if len(f.Clusters) > maxClusters {
		return nil, fmt.Errorf("auth-clusters-file %s: %d clusters, at most %d", path, len(f.Clusters), maxClusters)
	}
	for i, c := range f.Clusters {
		if c.Name == "" || c.Issuer == "" || c.Kubeconfig == "" {
			return nil, fmt.Errorf("auth-clusters-file %s: cluster %d: name, issuer and kubeconfig are required", path, i)
		}
	}
	return f.Clusters, nil
}

// checkClusters refuses names or issuers given twice: a token would not know its cluster.
func checkClusters(clusters []Cluster) error {
	names, issuers := map[string]bool{}, map[string]bool{}
	for _, c := range clusters {
		if len(c.Name) > 253 {
			return fmt.Errorf("auth: cluster name %.20q…: at most 253 characters", c.Name)
		}
		if names[c.Name] {
			return fmt.Errorf("auth: cluster %q is named twice", c.Name)
		}
		if issuers[c.Issuer] {
			return fmt.Errorf("auth: issuer %q is given to two clusters", c.Issuer)
		}
		names[c.Name], issuers[c.Issuer] = true, true
	}
	return nil
}

// ClusterOf returns the cluster u was authenticated by, if it is bound to one.
func ClusterOf(u user.Info) (string, bool) {
	if u == nil {
		return "", false
	}
	if v := u.GetExtra()[ClusterExtra]; len(v) == 1 && v[0] != "" {
		return v[0], true
	}
	return "", false
}

// boundTo returns u bound to cluster, or bound to none when cluster is "": what ClusterOf
// reads. A value the authenticator behind it set under the same key is replaced, never
// merged.
func boundTo(u user.Info, cluster string) user.Info {
	extra := make(map[string][]string, len(u.GetExtra())+1)
	for k, v := range u.GetExtra() {
		if k != ClusterExtra {
			extra[k] = v
		}
	}
	if cluster != "" {
		extra[ClusterExtra] = []string{cluster}
	}
	return &user.DefaultInfo{Name: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups(), Extra: extra}
}

// bindGroups binds a token-file identity to the cluster its groups name, if one.
type bindGroups struct{ next authenticator.Token }

func (b bindGroups) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	resp, ok, err := b.next.AuthenticateToken(ctx, token)
	if !ok || err != nil {
		return resp, ok, err
	}
	var clusters []string
	for _, g := range resp.User.GetGroups() {
		if c, found := strings.CutPrefix(g, ClusterGroupPrefix); found && c != "" {
			clusters = append(clusters, c)
		}
	}
	if len(clusters) > 1 {
		return nil, false, fmt.Errorf("the token of %s names %d clusters; an identity is bound to one", resp.User.GetName(), len(clusters))
	}
	cluster := ""
	if len(clusters) == 1 {
		cluster = clusters[0]
	}
	return &authenticator.Response{Audiences: resp.Audiences, User: boundTo(resp.User, cluster)}, true, nil
}

// reviewer is one cluster's TokenReview and SubjectAccessReview.
type reviewer struct {
	name  string
	authn authenticator.Request
	authz authorizer.Authorizer
}

// clusterReviews sends each token to the cluster that issued it, binds the caller to
// that cluster, and asks that cluster's RBAC what the caller may do.
type clusterReviews struct {
	// byIssuer picks the reviewer of a token by its (unverified) iss claim; with one
	// cluster and no issuers, every token goes to home, the cluster the services are in.
	byIssuer map[string]*reviewer
	home     *reviewer
	byName   map[string]*reviewer
}

func newClusterReviews(cfg Config, home kubernetes.Interface, clusters []Cluster, clientFor func(kubeconfig string) (kubernetes.Interface, error)) (*clusterReviews, error) {
	r := &clusterReviews{byIssuer: map[string]*reviewer{}, byName: map[string]*reviewer{}}
	all := append([]Cluster{{Name: cfg.Cluster, Issuer: cfg.Issuer}}, clusters...)
	if len(clusters) > 0 {
		if cfg.Cluster == "" || cfg.Issuer == "" {
			return nil, errors.New("auth: with auth-clusters-file, auth-cluster-name and auth-cluster-issuer name this cluster too")
		}
		if err := checkClusters(all); err != nil {
			return nil, err
		}
	}
	for i, c := range all {
		client := home
		if i > 0 {
			var err error
			if client, err = clientFor(c.Kubeconfig); err != nil {
				return nil, fmt.Errorf("auth: cluster %s: %w", c.Name, err)
			}
		}
		authn, authz, err := delegating(cfg, client)
		if err != nil {
			return nil, fmt.Errorf("auth: cluster %s: %w", c.Name, err)
		}
		rv := &reviewer{name: c.Name, authn: authn, authz: authz}
		if i == 0 {
			r.home = rv
		}
		if c.Issuer != "" {
			r.byIssuer[c.Issuer] = rv
		}
		if c.Name != "" {
			r.byName[c.Name] = rv
		}
	}
	if len(clusters) == 0 {
		r.byIssuer = nil
	}
	return r, nil
}

// maxTokenBytes bounds what is decoded of a token to read its issuer; the API server's
// own tokens are a kilobyte or two.
const maxTokenBytes = 16 << 10

// issuer reads a JWT's iss claim without checking its signature: it only picks the
// cluster whose TokenReview then checks everything.
func issuer(token string) (string, bool) {
	if len(token) > maxTokenBytes {
		return "", false
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", false
	}
	var claims struct {
		Issuer string `json:"iss"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Issuer == "" {
		return "", false
	}
	return claims.Issuer, true
}

// reviewerOf picks the cluster whose issuer token claims, or none.
func (c *clusterReviews) reviewerOf(token string) *reviewer {
	iss, ok := issuer(token)
	if !ok {
		return nil
	}
	return c.byIssuer[iss]
}

// AuthenticateRequest has the cluster that issued the request's token review it, as
// sent (no copy of the request on the hot path), and binds the caller to that cluster
// when it has a name.
func (c *clusterReviews) AuthenticateRequest(r *http.Request) (*authenticator.Response, bool, error) {
	rv := c.home
	if c.byIssuer != nil {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return nil, false, nil
		}
		if rv = c.reviewerOf(token); rv == nil {
			return nil, false, nil
		}
	}
	resp, ok, err := rv.authn.AuthenticateRequest(r)
	if !ok || err != nil {
		return resp, ok, err
	}
	// An unnamed cluster binds nobody; what the review said under our key is dropped.
	return &authenticator.Response{Audiences: resp.Audiences, User: boundTo(resp.User, rv.name)}, true, nil
}

// Authorize asks the RBAC of the caller's cluster: a ServiceAccount's name means
// something only in the cluster that issued it, and each cluster's decisions are cached
// apart.
func (c *clusterReviews) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	name, bound := ClusterOf(a.GetUser())
	if !bound {
		if c.home.name != "" {
			return authorizer.DecisionDeny, "the caller is bound to no cluster", nil
		}
		return c.home.authz.Authorize(ctx, a)
	}
	rv, ok := c.byName[name]
	if !ok {
		return authorizer.DecisionDeny, "the caller's cluster is not configured", nil
	}
	return rv.authz.Authorize(ctx, a)
}

// checkClusterOf refuses a bound caller a request that names another cluster.
func checkClusterOf(u user.Info, named []string) error {
	mine, bound := ClusterOf(u)
	if !bound {
		return nil
	}
	for _, c := range named {
		if c != mine {
			return fmt.Errorf("%s is bound to cluster %q and may not act for cluster %q", u.GetName(), mine, c)
		}
	}
	return nil
}
