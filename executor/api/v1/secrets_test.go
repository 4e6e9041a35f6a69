package v1_test

import (
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// withSecrets is the sample with spec.secrets (and spec.envVars, if given) as written in
// YAML, sent as written: a typed client would drop an empty key before the API server saw it.
func withSecrets(t *testing.T, ns, name, secrets, envVars string) *unstructured.Unstructured {
	t.Helper()
	ta := sample(t, ns)
	ta.Name = name
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ta)
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: raw}
	obj.SetAPIVersion(flytev1.GroupVersion.String())
	obj.SetKind("TaskAction")
	var list []any
	if err := yaml.Unmarshal([]byte(secrets), &list); err != nil {
		t.Fatalf("secrets %s: %v", secrets, err)
	}
	if err := unstructured.SetNestedSlice(obj.Object, list, "spec", "secrets"); err != nil {
		t.Fatal(err)
	}
	if envVars != "" {
		var vars map[string]any
		if err := yaml.Unmarshal([]byte(envVars), &vars); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedMap(obj.Object, vars, "spec", "envVars"); err != nil {
			t.Fatal(err)
		}
	}
	return obj
}

// TestSecretsAreValidatedAtAdmission: spec.secrets that cannot be rendered into a pod,
// or would be ambiguous there, are refused by the API server, with a message saying why.
func TestSecretsAreValidatedAtAdmission(t *testing.T) {
	ns := env.Namespace(t)
	long := "/" + strings.Repeat("d", 4095) // 4096 characters
	tests := []struct {
		name, secrets, envVars string
		want                   string // part of the API server's message; "" for accepted
	}{
		{name: "env", secrets: `[{name: db, key: password, env: DB_PASSWORD}]`},
		{name: "one key as a file", secrets: `[{name: db, key: password, mountPath: /etc/db}]`},
		{name: "the whole secret as files", secrets: `[{name: db, mountPath: /etc/db}]`},
		{name: "several", secrets: `[{name: db, key: user, env: DB_USER}, {name: db, key: password, env: DB_PASSWORD},
			{name: tls.certs, mountPath: /etc/tls}, {name: db, key: password, mountPath: /etc/db}, {name: api, mountPath: /etc/dbx}]`},
		{name: "keys with dots, dashes and underscores", secrets: `[{name: db, key: .ca-cert_1.pem, mountPath: /etc/ca}]`},
		{name: "a path of 4096 characters", secrets: `[{name: db, mountPath: ` + long + `}]`},
		{name: "an env name beside different envVars", secrets: `[{name: db, key: password, env: DB_PASSWORD}]`, envVars: `{DB_USER: app}`},

		{name: "no name", secrets: `[{key: password, env: DB_PASSWORD}]`, want: "spec.secrets[0].name: Required value"},
		{name: "a name that is not a DNS subdomain", secrets: `[{name: DB, key: password, env: DB_PASSWORD}]`, want: "spec.secrets[0].name"},
		{name: "empty key", secrets: `[{name: db, key: "", env: DB_PASSWORD}]`, want: "spec.secrets[0].key"},
		{name: "a key with a slash", secrets: `[{name: db, key: a/b, mountPath: /etc/db}]`, want: "spec.secrets[0].key"},
		{name: "the key ..", secrets: `[{name: db, key: "..", mountPath: /etc/db}]`, want: "a key is not '.' or '..'"},
		{name: "both env and mountPath", secrets: `[{name: db, key: password, env: DB_PASSWORD, mountPath: /etc/db}]`, want: "set exactly one of env and mountPath"},
		{name: "neither env nor mountPath", secrets: `[{name: db, key: password}]`, want: "set exactly one of env and mountPath"},
		{name: "env without a key", secrets: `[{name: db, env: DB_PASSWORD}]`, want: "env needs a key"},
		{name: "env that is not an identifier", secrets: `[{name: db, key: password, env: DB-PASSWORD}]`, want: "spec.secrets[0].env"},
		{name: "env the executor sets", secrets: `[{name: db, key: password, env: FLYTE_INPUT_URI}]`, want: "env names starting with FLYTE_ are the executor's own"},
		{name: "duplicate env names", secrets: `[{name: db, key: password, env: DB_PASSWORD}, {name: other, key: password, env: DB_PASSWORD}]`,
			want: "env names must be unique"},
		{name: "env name also in envVars", secrets: `[{name: db, key: password, env: DB_PASSWORD}]`, envVars: `{DB_PASSWORD: hunter2}`,
			want: "a secret's env name is also a key of envVars"},
		{name: "relative path", secrets: `[{name: db, key: password, mountPath: etc/db}]`, want: "spec.secrets[0].mountPath"},
		{name: "the root", secrets: `[{name: db, mountPath: /}]`, want: "spec.secrets[0].mountPath"},
		{name: "a trailing slash", secrets: `[{name: db, mountPath: /etc/db/}]`, want: "spec.secrets[0].mountPath"},
		{name: "a .. segment", secrets: `[{name: db, key: password, mountPath: /etc/../root}]`, want: "mountPath has no '.' or '..' segments"},
		{name: "a trailing ..", secrets: `[{name: db, mountPath: /etc/db/..}]`, want: "mountPath has no '.' or '..' segments"},
		{name: "a path over 4096 characters", secrets: `[{name: db, mountPath: ` + long + `d}]`, want: "spec.secrets[0].mountPath"},
		{name: "a path over 4096 bytes", secrets: `[{name: db, mountPath: /` + strings.Repeat("é", 2048) + `}]`, want: "mountPath is at most 4096 bytes"},
		{name: "duplicate mount paths", secrets: `[{name: db, key: user, mountPath: /etc/db}, {name: db, key: password, mountPath: /etc/db}]`,
			want: "mountPaths must be unique and not nested inside one another"},
		{name: "a mount path inside another", secrets: `[{name: db, mountPath: /etc/db}, {name: tls, mountPath: /etc/db/tls}]`,
			want: "mountPaths must be unique and not nested inside one another"},
		{name: "a mount path around another", secrets: `[{name: tls, mountPath: /etc/db/tls}, {name: db, mountPath: /etc}]`,
			want: "mountPaths must be unique and not nested inside one another"},
		{name: "too many", secrets: "[" + strings.Repeat("{name: db, key: k, env: E}, ", 64) + "{name: db, key: k, env: E}]",
			want: "spec.secrets: Too many"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := withSecrets(t, ns, fmt.Sprintf("secrets-%d", i), tt.secrets, tt.envVars)
			err := env.Client.Create(ctx(t), obj)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v; want Invalid mentioning %q", err, tt.want)
			}
		})
	}
}

// TestSecretsAreImmutable: like the rest of the spec, the secrets of an action that
// exists do not change.
func TestSecretsAreImmutable(t *testing.T) {
	ns := env.Namespace(t)
	obj := withSecrets(t, ns, "immutable", `[{name: db, key: password, env: DB_PASSWORD}]`, "")
	if err := env.Client.Create(ctx(t), obj); err != nil {
		t.Fatal(err)
	}
	secrets, _, _ := unstructured.NestedSlice(obj.Object, "spec", "secrets")
	secrets[0].(map[string]any)["name"] = "other"
	if err := unstructured.SetNestedSlice(obj.Object, secrets, "spec", "secrets"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Update(ctx(t), obj); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec is immutable") {
		t.Fatalf("changing spec.secrets: %v; want Invalid: spec is immutable", err)
	}
}
