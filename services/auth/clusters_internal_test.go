package auth

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
)

func jwt(payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(payload)) + "." + enc([]byte("sig"))
}

// TestIssuerPicksTheClusterOnly: a token's iss claim is read without its signature
// checked, only to pick the cluster that reviews it; anything but a JWT with an issuer
// picks none, and a huge token is not decoded.
func TestIssuerPicksTheClusterOnly(t *testing.T) {
	for _, tc := range []struct {
		name, token, want string
	}{
		{"a ServiceAccount token", jwt(`{"iss":"https://east.example","sub":"x"}`), "https://east.example"},
		{"no issuer", jwt(`{"sub":"x"}`), ""},
		{"an issuer that is not a string", jwt(`{"iss":7}`), ""},
		{"not JSON", jwt(`iss`), ""},
		{"two parts", "a.b", ""},
		{"not base64", "a.%%%.c", ""},
		{"a static token", "0123456789abcdef", ""},
		{"too long to decode", jwt(`{"iss":"https://east.example","pad":"` + strings.Repeat("x", maxTokenBytes) + `"}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := issuer(tc.token)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("issuer = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// staticToken authenticates every token as u.
type staticToken struct{ u user.Info }

func (s staticToken) AuthenticateToken(context.Context, string) (*authenticator.Response, bool, error) {
	return &authenticator.Response{User: s.u}, true, nil
}

// TestATokenFileGroupBindsACluster: in token-file mode a token is bound to the cluster
// its group "flyte:cluster:NAME" names, to none without one, and refused with two; an
// extra that claims a cluster is never taken for a binding.
func TestATokenFileGroupBindsACluster(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups []string
		extra  map[string][]string
		want   string
		fails  bool
	}{
		{name: "bound", groups: []string{Executors, "flyte:cluster:east"}, want: "east"},
		{name: "unbound", groups: []string{Executors}},
		{name: "an extra is no binding", groups: []string{Executors}, extra: map[string][]string{ClusterExtra: {"west"}}},
		{name: "the group wins over an extra", groups: []string{"flyte:cluster:east"}, extra: map[string][]string{ClusterExtra: {"west"}}, want: "east"},
		{name: "two clusters", groups: []string{"flyte:cluster:east", "flyte:cluster:west"}, fails: true},
		{name: "an empty name binds nothing", groups: []string{"flyte:cluster:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bindGroups{next: staticToken{&user.DefaultInfo{Name: "x", Groups: tc.groups, Extra: tc.extra}}}
			resp, ok, err := b.AuthenticateToken(context.Background(), "t")
			if tc.fails {
				if ok || err == nil {
					t.Fatalf("authenticated (%v, %v), want refused", ok, err)
				}
				return
			}
			if !ok || err != nil {
				t.Fatalf("refused: %v", err)
			}
			got, bound := ClusterOf(resp.User)
			if got != tc.want || bound != (tc.want != "") {
				t.Errorf("bound to %q (%v), want %q", got, bound, tc.want)
			}
		})
	}
}

// TestABoundCallerActsForItsClusterOnly: a caller bound to a cluster may act for that
// cluster only, and not for a request that names none; an unbound one is not checked.
func TestABoundCallerActsForItsClusterOnly(t *testing.T) {
	east := boundTo(&user.DefaultInfo{Name: "executor"}, "east")
	for _, tc := range []struct {
		name  string
		u     user.Info
		named []string
		fails bool
	}{
		{"its own", east, []string{"east"}, false},
		{"another", east, []string{"east", "west"}, true},
		{"none named", east, []string{""}, true},
		{"nothing to check", east, nil, false},
		{"unbound", &user.DefaultInfo{Name: "admin"}, []string{"west", ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkClusterOf(tc.u, tc.named)
			if (err != nil) != tc.fails {
				t.Errorf("checkClusterOf = %v, want failed %v", err, tc.fails)
			}
		})
	}
}

// TestTheClustersFileIsChecked: a clusters file that misses a field, is not YAML of the
// format, names a cluster or an issuer twice, or lists too many, is refused at start.
func TestTheClustersFileIsChecked(t *testing.T) {
	many := "clusters:\n" + strings.Repeat("- {name: x, issuer: y, kubeconfig: z}\n", maxClusters+1)
	for _, tc := range []struct {
		name, file, want string
	}{
		{"no issuer", "clusters:\n- {name: west, kubeconfig: /k}\n", "name, issuer and kubeconfig are required"},
		{"an unknown field", "clusters:\n- {name: west, issuer: https://w, kubeconfig: /k, token: x}\n", "unknown field"},
		{"too many", many, "at most 64"},
		{"a name twice", "clusters:\n- {name: east, issuer: https://w, kubeconfig: /k}\n", `cluster "east" is named twice`},
		{"an issuer twice", "clusters:\n- {name: west, issuer: https://e, kubeconfig: /k}\n", `issuer "https://e" is given to two clusters`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "clusters.yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			clusters, err := readClusters(path)
			if err == nil {
				err = checkClusters(append([]Cluster{{Name: "east", Issuer: "https://e"}}, clusters...))
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to say %q", err, tc.want)
			}
		})
	}
}
