package prefix_test

import (
	"strings"
	"testing"

	"github.com/flytekube/backend/executor/datastore/prefix"
)

func TestParseURIRefusesAmbiguousURIs(t *testing.T) {
	tests := []struct {
		uri  string
		want string // a substring of the error; "" means accepted
	}{
		{"s3://bucket/a/b.json", ""},
		{"file:///data/a/b.json", ""},
		{"mem://b/x", ""},
		{"", "not an absolute URI"},
		{"relative/path", "not an absolute URI"},
		{"file:relative", "not an absolute URI"},
		{"file://host/data/x", "file URIs have no host"},
		{"s3:///key", "needs a bucket"},
		{"s3://bucket", "names no object"},
		{"s3://bucket/", "names no object"},
		{"s3://bucket/dir/", "empty path segment"},
		{"s3://bucket/a//b", "empty path segment"},
		{"s3://bucket/a/../b", `"." or ".."`},
		{"s3://bucket/a/./b", `"." or ".."`},
		{"file:///data/a/%2e%2e/%2e%2e/etc/passwd", `"." or ".."`},
		{"file:///data/a%2F..%2F..%2Fetc/passwd", "encoded slash"},
		{"file:///data/a%2f..%2fsecret", "encoded slash"},
		{"file:///data/a%5C..%5Csecret", "encoded slash"},
		{"s3://bucket/a?versionId=1", "query"},
		{"s3://bucket/a?", "query"},
		{"s3://bucket/a#frag", "fragment"},
		{"s3://user:pw@bucket/a", "user information"},
		{"s3://bucket:9000/a", "port"},
		{"file:///data/a%00b", "control character"},
	}
	for _, tt := range tests {
		_, err := prefix.ParseURI(tt.uri)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("ParseURI(%q) = %v; want it accepted", tt.uri, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("ParseURI(%q) = %v; want an error containing %q", tt.uri, err, tt.want)
		}
	}
}

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		prefix string
		want   string // the canonical form, or the error's substring after "error: "
	}{
		{"s3://flyte-data/{project}/{domain}", "s3://flyte-data/{project}/{domain}/"},
		{"s3://flyte-data/{project}/{domain}/", "s3://flyte-data/{project}/{domain}/"},
		{"s3://flyte-data", "s3://flyte-data/"},
		{"file:///var/lib/flyte/data", "file:///var/lib/flyte/data/"},
		{"mem://outputs/", "mem://outputs/"},
		{"file:///", "error: the whole file system"},
		{"file://", "error: the whole file system"},
		{"file:///proc/self", "error: system directory /proc"},
		{"file:///var", "error: system directory /var/run"},
		{"file:///var/run/secrets/kubernetes.io", "error: system directory /var/run"},
		{"file:///etc/", "error: system directory /etc"},
		// The node's own trees: the kubelet's pods and volumes, etcd's data, the
		// container runtime's images and snapshots, the system's programs, pods' logs.
		{"file:///var/lib/kubelet/pods", "error: system directory /var/lib/kubelet"},
		{"file:///var/lib/etcd", "error: system directory /var/lib/etcd"},
		{"file:///var/lib/containerd/io.containerd.snapshotter.v1.overlayfs", "error: system directory /var/lib/containerd"},
		{"file:///var/lib", "error: system directory /var/lib/"},
		{"file:///usr/local/data", "error: system directory /usr"},
		{"file:///var/log/pods", "error: system directory /var/log"},
		{"file:///var/lib/flyte-data", "file:///var/lib/flyte-data/"},
		{"s3://b/{project}-{domain}/", "error: placeholders must be whole path segments"},
		{"s3://b/{team}/", "error: unknown placeholder {team}"},
		{"s3://b/x/../y", `error: "." or ".."`},
		{"s3://b/x?y", "error: query"},
		{"gs:///x", "error: needs a bucket"},
		{"data/x", "error: not an absolute URI"},
	}
	for _, tt := range tests {
		p, err := prefix.Parse(tt.prefix)
		if want, isErr := strings.CutPrefix(tt.want, "error: "); isErr {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Parse(%q) = %v, %v; want an error containing %q", tt.prefix, p, err, want)
			}
			continue
		}
		if err != nil || p.String() != tt.want {
			t.Errorf("Parse(%q) = %v, %v; want %s", tt.prefix, p, err, tt.want)
		}
	}
}

func TestMatch(t *testing.T) {
	templated := must(prefix.Parse("s3://data/{project}/{domain}/"))
	plain := must(prefix.Parse("file:///srv/flyte"))
	tests := []struct {
		p                    prefix.Prefix
		uri                  string
		ok                   bool
		wantProject, wantDom string
	}{
		{templated, "s3://data/p1/dev/run/a/1/outputs.json", true, "p1", "dev"},
		{templated, "s3://data/p1/dev", false, "", ""}, // the prefix itself is no object under it
		{templated, "s3://data/p1", false, "", ""},
		{templated, "s3://other/p1/dev/x", false, "", ""},
		{templated, "gs://data/p1/dev/x", false, "", ""},
		{plain, "file:///srv/flyte/x/y", true, "", ""},
		{plain, "file:///srv/flyte-evil/x", false, "", ""}, // whole segments, not strings
		{plain, "file:///srv/x", false, "", ""},
		{plain, "s3://srv/flyte/x", false, "", ""},
	}
	for _, tt := range tests {
		loc := must(prefix.ParseURI(tt.uri))
		vars, ok := tt.p.Match(loc)
		if ok != tt.ok || vars.Project != tt.wantProject || vars.Domain != tt.wantDom {
			t.Errorf("%s.Match(%s) = %+v, %v; want %q, %q, %v", tt.p, tt.uri, vars, ok, tt.wantProject, tt.wantDom, tt.ok)
		}
	}
}

func TestExpand(t *testing.T) {
	p := must(prefix.Parse("s3://data/{project}/{domain}/"))
	got, err := p.Expand("p1", "dev")
	if err != nil || got.String() != "s3://data/p1/dev/" || got.Templated() {
		t.Fatalf("Expand = %v, %v", got, err)
	}
	if _, ok := got.Match(must(prefix.ParseURI("s3://data/p2/dev/x"))); ok {
		t.Fatal("an expanded prefix matched another project's URI")
	}
	for _, bad := range [][2]string{{"", "dev"}, {"..", "dev"}, {"p1", "a/b"}, {"p1", "."}, {"p%2f", "dev"}} {
		if got, err := p.Expand(bad[0], bad[1]); err == nil {
			t.Errorf("Expand(%q, %q) = %v; want an error", bad[0], bad[1], got)
		}
	}
	// A literal prefix treats braces as characters: an action's own URI is no template.
	lit := must(prefix.ParseLiteral("s3://data/{project}/"))
	if _, ok := lit.Match(must(prefix.ParseURI("s3://data/p1/x"))); ok || lit.Templated() {
		t.Fatal("a literal prefix's braces matched as a placeholder")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestClaim(t *testing.T) {
	p, err := prefix.Parse("file:///data/projects/{project}/{domain}")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		uri  string
		want prefix.Vars
		ok   bool
	}{
		{"file:///data/projects/b/dev/r/a/1/outputs.json", prefix.Vars{Project: "b", Domain: "dev"}, true},
		{"file:///data/projects/b/notes.json", prefix.Vars{Project: "b", Domain: "notes.json"}, true},
		{"file:///data/projects/b", prefix.Vars{Project: "b"}, true},
		{"file:///data/projects", prefix.Vars{}, false},       // above every placeholder
		{"file:///data/shared/b/dev/x", prefix.Vars{}, false}, // a literal segment differs
		{"s3://data/projects/b/dev/x", prefix.Vars{}, false},
	}
	for _, tt := range tests {
		loc, err := prefix.ParseURI(tt.uri)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := p.Claim(loc); got != tt.want || ok != tt.ok {
			t.Errorf("Claim(%s) = %+v, %v; want %+v, %v", tt.uri, got, ok, tt.want, tt.ok)
		}
	}
}
