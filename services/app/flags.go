package app

import (
	"flag"

	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
)

// SecurityFlags registers the flags every service takes for TLS, authentication and the
// limits that hold under attack.
func SecurityFlags(fs *flag.FlagSet, srv *server.Config, a *auth.Config) {
	defaults := server.Config{}.WithDefaults()
	fs.StringVar(&srv.TLSCertFile, "tls-cert-file", "", "PEM certificate to serve TLS with (re-read when it changes); without it the port speaks h2c")
	fs.StringVar(&srv.TLSKeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	fs.DurationVar(&srv.BodyReadTimeout, "body-read-timeout", defaults.BodyReadTimeout, "longest a client may take to send a request body")
	fs.DurationVar(&srv.WriteStallTimeout, "write-stall-timeout", defaults.WriteStallTimeout, "longest one write of a response may wait for a client that stopped reading")
	fs.Int64Var(&srv.MaxInFlightBytes, "max-inflight-bytes", defaults.MaxInFlightBytes, "request bytes all calls in progress may hold at once")
	fs.IntVar(&srv.MaxConcurrentStreams, "max-concurrent-streams", defaults.MaxConcurrentStreams, "HTTP/2 streams one connection may have open")

	fs.Func("auth-mode", `how callers are authenticated (required): "kubernetes" (TokenReview and SubjectAccessReview), "token-file" or "none"`,
		func(v string) error { a.Mode = auth.Mode(v); return nil })
	fs.StringVar(&a.TokenFile, "auth-token-file", "", `static tokens of token-file mode: CSV lines token,user,uid,"group1,group2"`)
	fs.StringVar(&a.Audience, "auth-audience", auth.DefaultAudience, "audience ServiceAccount tokens must be bound to (kubernetes mode)")
	fs.StringVar(&a.Cluster, "auth-cluster-name", "", "this cluster's name (kubernetes mode): callers its API server authenticates are bound to it, and an executor may record only actions that name it; empty binds nobody")
	fs.StringVar(&a.Issuer, "auth-cluster-issuer", "", "this cluster's ServiceAccount token issuer (kubernetes mode; required with --auth-clusters-file)")
	fs.StringVar(&a.ClustersFile, "auth-clusters-file", "", "YAML file of further clusters whose executors report here (kubernetes mode): clusters: [{name, issuer, kubeconfig}]")
	fs.StringVar(&a.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server that checks tokens (kubernetes mode); default $KUBECONFIG, else in-cluster")
}
