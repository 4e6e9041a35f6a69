package auth

import (
	"errors"
	"fmt"
	"time"
)

// Mode says how callers are authenticated.
type Mode string

const (
	// ModeKubernetes checks bearer tokens with TokenReview and decides with
	// SubjectAccessReview, both against the cluster's API server.
	ModeKubernetes Mode = "kubernetes"
	// ModeTokenFile checks bearer tokens against a static file in kube-apiserver's
	// token format and decides by group (Executors, Viewers, Operators).
	ModeTokenFile Mode = "token-file"
	// ModeNone lets every caller do everything. Only for a closed laptop set-up.
	ModeNone Mode = "none"
)

// Groups of token-file mode.
const (
	// Executors may call every RPC.
	Executors = "flyte:executors"
	// Viewers may call the read RPCs of a project, and nothing cluster-wide.
	Viewers = "flyte:viewers"
	// Operators may call the CloudEvents egress RPCs (ListSinks, ListDeadLetters,
	// ReplayDeadLetters), which are cluster-wide: what ClusterRole
	// flyte-services-egress-operator grants in kubernetes mode.
	Operators = "flyte:operators"
)

// DefaultAudience is the audience a ServiceAccount token must be bound to.
const DefaultAudience = "flyte"

// Config says how to authenticate and authorize callers.
type Config struct {
	// Mode is required: a service given no credentials to check refuses to start.
	Mode Mode
	// TokenFile is the static token file of ModeTokenFile: CSV lines
	// `token,user,uid,"group1,group2"`.
	TokenFile string
	// Audience is the audience tokens must be bound to in ModeKubernetes.
	Audience string
	// Kubeconfig locates the API server in ModeKubernetes; empty means $KUBECONFIG, or
	// the in-cluster configuration.
	Kubeconfig string
	// Cluster names the cluster Kubeconfig reaches (kubernetes mode). With a name, every
	// caller it authenticates is bound to it: an executor may then record only actions
	// that name this cluster. Empty binds nobody (one cluster, as before).
	Cluster string
	// Issuer is that cluster's ServiceAccount token issuer; required with ClustersFile,
	// where a token's iss claim picks the cluster that reviews it.
	Issuer string
	// ClustersFile lists further clusters whose executors report here (ClustersFile's
	// format: name, issuer and kubeconfig of each); each caller is bound to the cluster
	// that issued its token.
	ClustersFile string
	// TokenCacheTTL is how long a TokenReview answer is reused.
	TokenCacheTTL time.Duration
	// AllowCacheTTL and DenyCacheTTL are how long a SubjectAccessReview answer is reused.
	AllowCacheTTL, DenyCacheTTL time.Duration
}

// WithDefaults returns c with every zero field but Mode set to its default.
func (c Config) WithDefaults() Config {
	if c.Audience == "" {
		c.Audience = DefaultAudience
	}
	if c.TokenCacheTTL == 0 {
		c.TokenCacheTTL = 10 * time.Second
	}
	if c.AllowCacheTTL == 0 {
		c.AllowCacheTTL = 10 * time.Second
	}
	if c.DenyCacheTTL == 0 {
		c.DenyCacheTTL = 5 * time.Second
	}
	return c
}

// errNoMode names the choices, since it is what an operator sees first.
var errNoMode = errors.New(`auth-mode: required, one of "kubernetes" (TokenReview and SubjectAccessReview), ` +
	`"token-file" (with --auth-token-file) or "none" (no authentication; only for a closed laptop set-up)`)

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch c.Mode {
	case "":
		return errNoMode
	case ModeKubernetes:
		if c.Audience == "" {
			return errors.New("auth-audience: required in kubernetes mode")
		}
		if c.ClustersFile != "" && (c.Cluster == "" || c.Issuer == "") {
			return errors.New("auth-clusters-file: auth-cluster-name and auth-cluster-issuer must name this cluster too")
		}
	case ModeTokenFile:
		if c.TokenFile == "" {
			return errors.New("auth-token-file: required in token-file mode")
		}
		if c.Cluster != "" || c.Issuer != "" || c.ClustersFile != "" {
			return errors.New("auth-cluster-name, auth-cluster-issuer and auth-clusters-file are for kubernetes mode; " +
				`in token-file mode a token's group "` + ClusterGroupPrefix + `NAME" binds it to a cluster`)
		}
	case ModeNone:
	default:
		return fmt.Errorf("auth-mode: %q is not one of kubernetes, token-file, none", c.Mode)
	}
	if c.TokenCacheTTL < 0 || c.AllowCacheTTL < 0 || c.DenyCacheTTL < 0 {
		return errors.New("auth cache TTLs must not be negative")
	}
	return nil
}
