package auth_test

import (
	"strings"
	"testing"

	"github.com/flytekube/backend/services/auth"
)

// TestConfigIsSecureByDefault: a service told nothing about its callers refuses to
// start, and says what it could be told.
func TestConfigIsSecureByDefault(t *testing.T) {
	tests := []struct {
		name string
		cfg  auth.Config
		want []string // substrings of the error; none means valid
	}{
		{"no mode", auth.Config{}, []string{"auth-mode: required", `"kubernetes"`, `"token-file"`, `"none"`}},
		{"unknown mode", auth.Config{Mode: "open"}, []string{`"open" is not one of`}},
		{"token-file without a file", auth.Config{Mode: auth.ModeTokenFile}, []string{"auth-token-file: required"}},
		{"negative cache", auth.Config{Mode: auth.ModeNone, TokenCacheTTL: -1}, []string{"must not be negative"}},
		{"token-file", auth.Config{Mode: auth.ModeTokenFile, TokenFile: "/tokens.csv"}, nil},
		{"kubernetes", auth.Config{Mode: auth.ModeKubernetes}, nil},
		{"none, asked for by name", auth.Config{Mode: auth.ModeNone}, nil},
		{"clusters file without this cluster's name", auth.Config{Mode: auth.ModeKubernetes, ClustersFile: "/c.yaml", Issuer: "https://a"},
			[]string{"auth-cluster-name and auth-cluster-issuer must name this cluster too"}},
		{"clusters file without this cluster's issuer", auth.Config{Mode: auth.ModeKubernetes, ClustersFile: "/c.yaml", Cluster: "a"},
			[]string{"must name this cluster too"}},
		{"a cluster name in token-file mode", auth.Config{Mode: auth.ModeTokenFile, TokenFile: "/tokens.csv", Cluster: "a"},
			[]string{"are for kubernetes mode", `"flyte:cluster:NAME"`}},
		{"kubernetes, this cluster named", auth.Config{Mode: auth.ModeKubernetes, Cluster: "a"}, nil},
		{"kubernetes, several clusters", auth.Config{Mode: auth.ModeKubernetes, Cluster: "a", Issuer: "https://a", ClustersFile: "/c.yaml"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.WithDefaults().Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
