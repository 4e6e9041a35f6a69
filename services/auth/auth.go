package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

type userInfo = user.Info

// Auth authenticates requests and authorizes RPCs.
type Auth struct {
	mode     Mode
	audience authenticator.Audiences
	authn    authenticator.Request // nil in mode none
	authz    authorizer.Authorizer
	denied   *prometheus.CounterVec
	// known are the procedures of the rules given to Interceptor: the only values the
	// metric's procedure label takes, so a caller inventing paths cannot grow it.
	known  map[string]bool
	log    *slog.Logger
	errors *connect.ErrorWriter
}

// New builds the authenticator and authorizer cfg describes; reg receives the metric of
// refused calls. client, when not nil, reaches the API server in kubernetes mode (tests
// pass one); otherwise cfg.Kubeconfig or the in-cluster configuration is used.
func New(cfg Config, client kubernetes.Interface, reg prometheus.Registerer, log *slog.Logger) (*Auth, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Auth{
		mode:     cfg.Mode,
		audience: authenticator.Audiences{cfg.Audience},
		log:      log,
		errors:   connect.NewErrorWriter(),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_rpc_denied_total",
			Help: "RPCs refused before they ran: unauthenticated (no or bad token), forbidden (not allowed) or unavailable (the API server could not be asked).",
		}, []string{"procedure", "reason"}),
	}
	if err := reg.Register(a.denied); err != nil {
		return nil, fmt.Errorf("auth: registering metrics: %w", err)
	}
	switch cfg.Mode {
	case ModeNone:
		log.Warn("authentication is off (auth-mode none): every caller that reaches this port may do everything")
		a.authz = allowAll
	case ModeTokenFile:
		tokens, err := newReloadingTokenFile(cfg.TokenFile, reg, log)
		if err != nil {
			return nil, err
		}
		a.authn = bearertoken.New(bindGroups{next: tokens})
		a.authz = byGroup
	case ModeKubernetes:
		if client == nil {
			var err error
			if client, err = kubeClient(cfg.Kubeconfig); err != nil {
				return nil, err
			}
		}
		var clusters []Cluster
		if cfg.ClustersFile != "" {
			var err error
			if clusters, err = readClusters(cfg.ClustersFile); err != nil {
				return nil, err
			}
		}
		reviews, err := newClusterReviews(cfg, client, clusters, kubeClient)
		if err != nil {
			return nil, err
		}
		a.authn, a.authz = reviews, authorizer.AuthorizerFunc(reviews.Authorize)
	}
	return a, nil
}

// delegating asks the API server, with its answers cached for the configured TTLs.
func delegating(cfg Config, client kubernetes.Interface) (authenticator.Request, authorizer.Authorizer, error) {
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient: client.AuthenticationV1(),
		WebhookRetryBackoff:     reviewBackoff(),
		CacheTTL:                cfg.TokenCacheTTL,
		APIAudiences:            authenticator.Audiences{cfg.Audience},
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("auth: TokenReview authenticator: %w", err)
	}
	// Decisions are cached in front of the reviewer (newCachedDecisions), not by it.
	reviews, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		WebhookRetryBackoff:       reviewBackoff(),
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("auth: SubjectAccessReview authorizer: %w", err)
	}
	return authn, newCachedDecisions(reviews, cfg.AllowCacheTTL, cfg.DenyCacheTTL), nil
}

// reviewBackoff retries a review the API server failed to answer a few times, quickly,
// as kube-apiserver's own delegated authentication does.
func reviewBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" && os.Getenv("KUBECONFIG") == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kubeconfig
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("auth: kubernetes mode needs an API server (kubeconfig or in-cluster): %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("auth: kubernetes client: %w", err)
	}
	return client, nil
}

var errUnauthenticated = errors.New("a valid bearer token is required")

// Middleware authenticates each request before its body is read and puts the caller in
// the request's context. A request without a valid token ends here with Unauthenticated,
// spoken in the request's protocol (Connect, gRPC or gRPC-Web).
func (a *Auth) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.authn == nil {
			next.ServeHTTP(w, r.WithContext(WithUser(r.Context(), Anonymous)))
			return
		}
		// The audience goes in the TokenReview, so a token minted for the API server
		// (or anything else) is refused here.
		ctx := authenticator.WithAudiences(r.Context(), a.audience)
		resp, ok, err := a.authn.AuthenticateRequest(r.WithContext(ctx))
		if err != nil || !ok {
			if err != nil {
				a.log.InfoContext(ctx, "authentication failed", "path", r.URL.Path, "error", err)
			}
			a.denied.WithLabelValues(a.procedureLabel(r.URL.Path), reasonUnauthenticated).Inc()
			a.writeError(w, r, connect.NewError(connect.CodeUnauthenticated, errUnauthenticated))
			return
		}
		next.ServeHTTP(w, r.WithContext(WithUser(r.Context(), resp.User)))
	})
}

func (a *Auth) writeError(w http.ResponseWriter, r *http.Request, err *connect.Error) {
	if a.errors.IsSupported(r) {
		_ = a.errors.Write(w, r, err)
		return
	}
	http.Error(w, err.Message(), http.StatusUnauthorized)
}

// Interceptor authorizes each RPC by its rule once its request message is decoded and
// validated. Denied calls never reach the handler, so they write nothing. Call it before
// serving: the rules' procedures become the metric's label values, each starting at 0.
func (a *Auth) Interceptor(rules Rules) connect.Interceptor {
	a.known = make(map[string]bool, len(rules))
	for procedure := range rules {
		a.known[procedure] = true
		for _, reason := range []string{reasonUnauthenticated, reasonForbidden, reasonUnavailable} {
			a.denied.WithLabelValues(procedure, reason)
		}
	}
	return &interceptor{auth: a, rules: rules}
}

// Reasons of flyte_rpc_denied_total.
const (
	reasonUnauthenticated = "unauthenticated"
	reasonForbidden       = "forbidden"
	reasonUnavailable     = "unavailable"
)

// otherProcedure labels refusals of paths no rule names.
const otherProcedure = "other"

func (a *Auth) procedureLabel(path string) string {
	if a.known[path] {
		return path
	}
	return otherProcedure
}

// authorize checks the rule of procedure for msg.
func (a *Auth) authorize(ctx context.Context, rules Rules, procedure string, msg any) error {
	rule, ok := rules[procedure]
	if !ok {
		a.denied.WithLabelValues(otherProcedure, reasonForbidden).Inc()
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s is not open to any caller", procedure))
	}
	u := UserFrom(ctx)
	for _, r := range append([]Rule{rule}, rule.Also...) {
		if err := a.check(ctx, u, r, procedure, msg); err != nil {
			return err
		}
	}
	if rule.Clusters != nil {
		if err := checkClusterOf(u, rule.Clusters(msg)); err != nil {
			a.denied.WithLabelValues(procedure, reasonForbidden).Inc()
			return connect.NewError(connect.CodePermissionDenied, err)
		}
	}
	return nil
}

// check authorizes one rule of procedure for msg, in each project it touches.
func (a *Auth) check(ctx context.Context, u userInfo, rule Rule, procedure string, msg any) error {
	projects := []string{""}
	if rule.Projects != nil {
		if p := rule.Projects(msg); len(p) > 0 {
			projects = p
		}
	}
	for _, project := range projects {
		decision, _, err := a.authz.Authorize(ctx, rule.attributes(u, project))
		if decision == authorizer.DecisionAllow {
			continue
		}
		if err != nil {
			// The API server could not be asked: the caller may retry.
			a.denied.WithLabelValues(procedure, reasonUnavailable).Inc()
			a.log.WarnContext(ctx, "authorization failed", "procedure", procedure, "user", u.GetName(), "error", err)
			return connect.NewError(connect.CodeUnavailable, errors.New("authorization is unavailable, retry later"))
		}
		a.denied.WithLabelValues(procedure, reasonForbidden).Inc()
		where := "cluster-wide"
		if project != "" {
			where = "in project " + project
		}
		return connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("%s may not %s %s.%s %s", u.GetName(), rule.Verb, rule.Resource, rule.Group, where))
	}
	return nil
}

type interceptor struct {
	auth  *Auth
	rules Rules
}

func (i *interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		if err := i.auth.authorize(ctx, i.rules, req.Spec().Procedure, req.Any()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (i *interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i *interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, &authorizingConn{StreamingHandlerConn: conn, check: func(msg any) error {
			return i.auth.authorize(ctx, i.rules, conn.Spec().Procedure, msg)
		}})
	}
}

// authorizingConn authorizes a stream by its first request message, before the handler
// sees it.
type authorizingConn struct {
	connect.StreamingHandlerConn
	check   func(msg any) error
	checked bool
}

func (c *authorizingConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if c.checked {
		return nil
	}
	c.checked = true
	return c.check(msg)
}
