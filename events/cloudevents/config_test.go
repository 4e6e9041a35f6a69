package cloudevents

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/test/repo"
)

// configView is what a test compares of a Config.
type configView struct {
	kind              Kind
	name              string
	where             string // Target()
	target            string // HTTP: the URL called
	servers           []string
	subject, stream   string
	topic             string
	mode              Mode
	batchSize         int
	timeout           time.Duration
	caFile, tokenFile string
	projects, domains []string
	phases            []flytecorev1.ActionPhase
}

func view(c Config) configView {
	v := configView{
		kind: c.Kind(), name: c.Name(), where: c.Target(), servers: c.servers, subject: c.subject, stream: c.stream, topic: c.topic,
		mode: c.Mode(), batchSize: c.BatchSize(), timeout: c.Timeout(), caFile: c.caFile, tokenFile: c.tokenFile,
		projects: c.projects, domains: c.domains, phases: c.phases,
	}
	if c.target != nil {
		v.target = c.target.String()
	}
	return v
}

// sinksFile is a configuration file of one sink, given as the YAML of its list item.
func sinksFile(sink string) string {
	return "sinks:\n  - " + strings.ReplaceAll(strings.TrimSpace(sink), "\n", "\n    ") + "\n"
}

func TestDecode(t *testing.T) {
	tests := []struct {
		sink string
		want configView
	}{
		{"http: {url: 'http://receiver.example:8080/hook'}", configView{
			kind: KindHTTP, name: "http://receiver.example:8080#3ccd089c", where: "http://receiver.example:8080/REDACTED", target: "http://receiver.example:8080/hook",
			mode: Binary, timeout: DefaultTimeout,
		}},
		{`
name: audit
http: {url: 'https://receiver.example/hook?code=s3cret', mode: structured, timeout: 250ms, tokenFile: /var/run/token}
filter: {projects: [c, a, b, a], domains: [production], phases: [failed, TIMED_OUT]}`, configView{
			kind: KindHTTP, name: "audit", where: "https://receiver.example/REDACTED?code=REDACTED", target: "https://receiver.example/hook?code=s3cret",
			mode: Structured, timeout: 250 * time.Millisecond, tokenFile: "/var/run/token",
			projects: []string{"a", "b", "c"}, domains: []string{"production"},
			phases: []flytecorev1.ActionPhase{flytecorev1.ActionPhase_ACTION_PHASE_FAILED, flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT},
		}},
		{"http: {url: 'https://[::1]:8443/?topic=kept', caFile: /etc/ca.pem}", configView{
			kind: KindHTTP, name: "https://[::1]:8443#6a3d9800", where: "https://[::1]:8443/?topic=REDACTED", target: "https://[::1]:8443/?topic=kept",
			mode: Binary, timeout: DefaultTimeout, caFile: "/etc/ca.pem",
		}},
		{"http: {url: 'http://receiver.example/batch', mode: batch}", configView{
			kind: KindHTTP, name: "http://receiver.example#31b16609", where: "http://receiver.example/REDACTED", target: "http://receiver.example/batch",
			mode: Batched, batchSize: DefaultBatchSize, timeout: DefaultTimeout,
		}},
		{"http: {url: 'http://receiver.example/batch', mode: batch, batchSize: 1000, timeout: 10m}", configView{
			kind: KindHTTP, name: "http://receiver.example#31b16609", where: "http://receiver.example/REDACTED", target: "http://receiver.example/batch",
			mode: Batched, batchSize: 1000, timeout: 10 * time.Minute,
		}},
		{"nats: {servers: [nats.example]}", configView{
			kind: KindNATS, name: "nats://nats.example:4222/flyte.actions", where: "nats://nats.example:4222/flyte.actions", servers: []string{"nats.example:4222"},
			subject: "flyte.actions", mode: Structured, timeout: DefaultTimeout,
		}},
		{`
nats: {servers: ['n1:4222', 'n2:4223'], subject: flyte.events, stream: FLYTE, tokenFile: /t}
filter: {phases: [succeeded]}`, configView{
			kind: KindNATS, name: "nats://n1:4222,n2:4223/flyte.events", where: "nats://n1:4222,n2:4223/flyte.events", servers: []string{"n1:4222", "n2:4223"},
			subject: "flyte.events", stream: "FLYTE", mode: Structured, timeout: DefaultTimeout, tokenFile: "/t",
			phases: []flytecorev1.ActionPhase{flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED},
		}},
		{"kafka: {brokers: [k1, 'k2:9093'], topic: flyte-actions}", configView{
			kind: KindKafka, name: "kafka://k1:9092,k2:9093/flyte-actions", where: "kafka://k1:9092,k2:9093/flyte-actions", servers: []string{"k1:9092", "k2:9093"},
			topic: "flyte-actions", mode: Binary, timeout: DefaultTimeout,
		}},
		{`
name: k
kafka: {brokers: ['[::1]:9092'], topic: t, mode: structured, timeout: 1m, caFile: /ca}
filter: {domains: [development]}`, configView{
			kind: KindKafka, name: "k", where: "kafka://[::1]:9092/t", servers: []string{"[::1]:9092"}, topic: "t", mode: Structured, timeout: time.Minute,
			caFile: "/ca", domains: []string{"development"},
		}},
	}
	for _, tc := range tests {
		t.Run(strings.TrimSpace(tc.sink), func(t *testing.T) {
			sinks, err := Decode([]byte(sinksFile(tc.sink)))
			if err != nil {
				t.Fatal(err)
			}
			if len(sinks) != 1 {
				t.Fatalf("%d sinks, want 1", len(sinks))
			}
			if got := view(sinks[0]); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Every rule of a sink, and the file's own. Each error names the sink and the field,
// and shows none of the secrets the file holds.
func TestDecodeRefuses(t *testing.T) {
	long := strings.Repeat("n", 201)
	tests := []struct{ file, want string }{
		// The file.
		{"", "no sinks: list"},
		{"sinkz: []", `unknown field "sinkz"`},
		{"sinks: {}", "cannot unmarshal object"},
		{"- name: a\n  http: {url: 'http://h/x'}\n", "a list: want a mapping with a sinks: list"},
		{"sinks: [\n", "yaml"},
		{"sinks:\n  - name: a\n    name: b\n", `key "name" already set`},
		{"sinks:\n  - {name: a, nats: {servers: [nats1]}}\n  - {name: a, http: {url: 'http://h/x'}}\n", `sinks[1] "a": name: sinks[0] has it too`},
		{"sinks:\n  - nats: {servers: [nats1]}\n  - nats: {servers: ['nats1:4222']}\n", `sinks[1]: name: sinks[0] has it too ("nats://nats1:4222/flyte.actions"): give one a name of its own`},
		{"sinks:\n  - {name: ok, nats: {servers: [nats1]}}\n  - {name: bad, nats: {servers: [nats1], subject: 'a b'}}\n", `sinks[1] "bad": nats.subject:`},
		// Which kind.
		{sinksFile("name: none"), `sinks[0] "none": want one of http, nats and kafka`},
		{sinksFile("{http: {url: 'http://h/x'}, nats: {servers: [nats1]}}"), "sinks[0]: want one of http, nats and kafka, not two"},
		{sinksFile("htpp: {url: 'http://h/x'}"), `sinks[0]: unknown field "htpp"`},
		// Fields no kind has, or another kind's. Secrets are never written inline.
		{sinksFile("http: {url: 'http://h/x', tokenfile: /t}"), `sinks[0]: unknown field "http.tokenfile"`},
		{sinksFile("http: {url: 'http://h/x', token: s3cret}"), `unknown field "http.token"`},
		{sinksFile("nats: {servers: [nats1], password: s3cret}"), `unknown field "nats.password"`},
		{sinksFile("nats: {servers: [nats1], mode: binary}"), `unknown field "nats.mode"`},
		{sinksFile("nats: {servers: [nats1], topic: x}"), `unknown field "nats.topic"`},
		{sinksFile("kafka: {brokers: [k], topic: t, tokenFile: /x}"), `unknown field "kafka.tokenFile"`},
		{sinksFile("kafka: {brokers: [k], topic: t, subject: s}"), `unknown field "kafka.subject"`},
		{sinksFile("{http: {url: 'http://h/x'}, filter: {phase: [failed]}}"), `unknown field "filter.phase"`},
		{sinksFile("http: {url: 'http://h/x', batchSize: ten}"), "http.batchSize"},
		// The name.
		{sinksFile("{name: has space, http: {url: 'http://h/x'}}"), `name: "has space": want printable text without spaces`},
		{sinksFile("{name: " + long + ", http: {url: 'http://h/x'}}"), "name: longer than 200 bytes"},
		// HTTP.
		{sinksFile("http: {mode: binary}"), "sinks[0]: http.url: required"},
		{sinksFile("http: {url: receiver.example/hook}"), "http.url: want an http:// or https:// URL"},
		{sinksFile("http: {url: 'ftp://host/x'}"), "http.url: want an http:// or https:// URL"},
		{sinksFile("http: {url: 'http:///path'}"), "http.url: no host"},
		{sinksFile("http: {url: 'https://user:pw@host/x'}"), "http.url: credentials in the URL are refused"},
		{sinksFile("http: {url: 'http://host/x#frag'}"), "http.url: a fragment"},
		{sinksFile("http: {url: 'http://host/x?a=%zz'}"), "http.url: its query"},
		{sinksFile("http: {url: 'http://host/x?mode=batch&sig=s3cret'}"), "http.url: the query's mode= was a sink's option in the URL form: set it in the file"},
		{sinksFile("http: {url: 'http://host/x?tokenfile=/t'}"), "http.url: the query's tokenfile="},
		{sinksFile("http: {url: 'http://host/x', mode: text}"), `http.mode: "text": want binary, structured or batch`},
		{sinksFile("http: {url: 'http://host/x', batchSize: 10}"), "http.batchSize: applies to mode batch only"},
		{sinksFile("http: {url: 'http://host/x', mode: batch, batchSize: -1}"), "http.batchSize: -1: want a number of events from 1 to 1000"},
		{sinksFile("http: {url: 'http://host/x', mode: batch, batchSize: 1001}"), "http.batchSize: 1001: want a number of events from 1 to 1000"},
		{sinksFile("http: {url: 'http://host/x', timeout: fast}"), `http.timeout: "fast": want a duration such as 5s, above 0 and at most 10m0s`},
		{sinksFile("http: {url: 'http://host/x', timeout: -1s}"), `http.timeout: "-1s"`},
		{sinksFile("http: {url: 'http://host/x', timeout: 0s}"), `http.timeout: "0s"`},
		{sinksFile("http: {url: 'http://host/x', timeout: 1h}"), `http.timeout: "1h"`},
		{sinksFile("http: {url: 'http://host/x', timeout: 5}"), "http.timeout"},
		{sinksFile("http: {url: 'http://host/x', caFile: /ca.pem}"), "http.caFile: applies to https only"},
		// Filters.
		{sinksFile("{http: {url: 'http://h/x'}, filter: {phases: [done]}}"), `filter.phases: "done": want one of queued, waiting_for_resources, initializing, running, succeeded, failed, aborted, timed_out`},
		{sinksFile("{http: {url: 'http://h/x'}, filter: {phases: [running, '']}}"), `filter.phases: ""`},
		{sinksFile("{http: {url: 'http://h/x'}, filter: {projects: [a, '', b]}}"), "filter.projects: an empty name"},
		{sinksFile("{http: {url: 'http://h/x'}, filter: {domains: []}}"), "filter.domains: an empty list takes nothing: leave it out to take every domain"},
		// NATS.
		{sinksFile("nats: {subject: flyte.actions}"), "nats.servers: want at least one host[:port]"},
		{sinksFile("nats: {servers: [nats1], subject: flyte.*}"), `nats.subject: "flyte.*": want dot-separated tokens`},
		{sinksFile("nats: {servers: [nats1], subject: a..b}"), `nats.subject: "a..b"`},
		{sinksFile("nats: {servers: [nats1], stream: A.B}"), `nats.stream: "A.B": want a stream name`},
		{sinksFile("nats: {servers: ['host:0']}"), `nats.servers: bad port in "host:0"`},
		{sinksFile("nats: {servers: ['host:x']}"), `nats.servers: bad port in "host:x"`},
		{sinksFile("nats: {servers: [a, '']}"), `nats.servers: bad host ""`},
		{sinksFile("nats: {servers: ['a,b']}"), `nats.servers: bad host "a,b"`},
		{sinksFile("nats: {servers: ['user:pw@host']}"), "nats.servers: credentials are refused"},
		{sinksFile("nats: {servers: ['nats://host:4222']}"), `nats.servers: bad host "nats://host:4222": want host[:port]`},
		// Kafka.
		{sinksFile("kafka: {topic: t}"), "kafka.brokers: want at least one host[:port]"},
		{sinksFile("kafka: {brokers: [k]}"), "kafka.topic: required"},
		{sinksFile("kafka: {brokers: [k], topic: a/b}"), `kafka.topic: "a/b": want letters, digits`},
		{sinksFile("kafka: {brokers: [k], topic: '..'}"), `kafka.topic: ".."`},
		{sinksFile("kafka: {brokers: [k], topic: t, mode: batch}"), `kafka.mode: "batch": want binary or structured`},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			sinks, err := Decode([]byte(tc.file))
			if err == nil {
				t.Fatalf("decoded as %v, want an error saying %q", sinks, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one saying %q", err, tc.want)
			}
			for _, secret := range []string{"pw", "s3cret"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q shows a credential", err)
				}
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "sinks.yaml")
	if err := os.WriteFile(file, []byte(`
# Every kind, as docs/events.md shows them.
sinks:
  - name: alerts
    http:
      url: https://hooks.example.com/flyte
      mode: batch
      batchSize: 50
      caFile: /etc/flyte/hook-ca.crt
      tokenFile: /etc/flyte/hook.token
    filter:
      phases: [failed, timed_out]
  - name: nats
    nats: {servers: ['nats:4222'], subject: flyte.actions, stream: FLYTE_ACTIONS}
  - name: kafka
    kafka: {brokers: ['broker-1:9092', 'broker-2:9092'], topic: flyte-actions}
    filter: {projects: [ml]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	sinks, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sinks {
		got = append(got, s.String())
	}
	want := []string{
		`http sink "alerts" -> https://hooks.example.com/REDACTED mode=batch batchSize=50 timeout=5s caFile=/etc/flyte/hook-ca.crt tokenFile=/etc/flyte/hook.token phases=failed,timed_out`,
		`nats sink "nats" -> nats://nats:4222/flyte.actions stream=FLYTE_ACTIONS mode=structured timeout=5s`,
		`kafka sink "kafka" -> kafka://broker-1:9092,broker-2:9092/flyte-actions mode=binary timeout=5s projects=ml`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	if err := os.WriteFile(file, []byte("sinks: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if sinks, err := Load(file); err != nil || len(sinks) != 0 {
		t.Errorf("sinks: [] loaded as %v, %v; want no sinks", sinks, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("a missing file: %v, want an error naming it", err)
	}
	if err := os.WriteFile(file, []byte(sinksFile("{name: x, http: {url: 'http://h/x', mode: text}}")), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(file); err == nil || !strings.HasPrefix(err.Error(), file+`: sinks[0] "x": http.mode: `) {
		t.Errorf("a bad sink: %v, want an error naming the file, the sink and the field", err)
	}
}

// TestDocumentedFileLoads: the example in docs/events.md is a valid file.
func TestDocumentedFileLoads(t *testing.T) {
	path, err := repo.Path("docs", "events.md")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(doc, []byte("\n```yaml\nsinks:\n"))
	example, _, closed := bytes.Cut(rest, []byte("\n```\n"))
	if !ok || !closed {
		t.Fatal("docs/events.md has no ```yaml block starting with sinks:")
	}
	sinks, err := Decode(append([]byte("sinks:\n"), example...))
	if err != nil {
		t.Fatalf("docs/events.md's example: %v", err)
	}
	if len(sinks) != 3 {
		t.Errorf("docs/events.md's example has %d sinks, want one of each kind", len(sinks))
	}
}

func TestAccepts(t *testing.T) {
	running := actionEvent(0, 0)
	failed := actionEvent(0, 1)
	failed.Phase = flytecorev1.ActionPhase_ACTION_PHASE_FAILED
	other := actionEvent(0, 0)
	other.Id.Project, other.Id.Domain = "other", "production"

	tests := []struct {
		filter string
		want   []bool // running, failed, other
	}{
		{"{}", []bool{true, true, true}},
		{"{projects: [flytesnacks]}", []bool{true, true, false}},
		{"{projects: [other, flytesnacks]}", []bool{true, true, true}},
		{"{domains: [production]}", []bool{false, false, true}},
		{"{phases: [failed, timed_out]}", []bool{false, true, false}},
		{"{phases: [running], projects: [other]}", []bool{false, false, true}},
		{"{projects: [flytesnack]}", []bool{false, false, false}}, // exact, not a prefix
	}
	for _, tc := range tests {
		t.Run(tc.filter, func(t *testing.T) {
			c := mustDecode(t, "{http: {url: 'http://host/x'}, filter: "+tc.filter+"}")
			got := []bool{c.Accepts(running), c.Accepts(failed), c.Accepts(other)}
			if !slices.Equal(got, tc.want) {
				t.Errorf("accepts %v, want %v", got, tc.want)
			}
		})
	}
}

// The configuration's printed and logged forms never show a token, the receiver's query
// values or its path, which in webhook URLs is often the credential: only the token
// file's path.
func TestConfigRedacts(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	const token = "tok-9f8e7d"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := mustDecode(t, "http: {url: 'https://receiver.example/hooks/p4thsecret?sig=s3cret', tokenFile: '"+tokenFile+"'}")
	sink, err := c.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	var logged bytes.Buffer
	for _, h := range []slog.Handler{slog.NewTextHandler(&logged, nil), slog.NewJSONHandler(&logged, nil)} {
		slog.New(h).Info("sink", "sink", c, "sinks", []Config{c})
	}
	for _, form := range []string{
		c.Name(), c.String(), c.Target(), fmt.Sprint(c), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%s", &c),
		c.LogValue().String(), logged.String(), fmt.Sprintf("%+v", sink), sink.Name(),
	} {
		for _, secret := range []string{"s3cret", token, "p4thsecret"} {
			if strings.Contains(form, secret) {
				t.Errorf("%q shows the secret %q", form, secret)
			}
		}
	}
	if s := c.String(); !strings.Contains(s, "https://receiver.example/REDACTED?sig=REDACTED") || !strings.Contains(s, "tokenFile="+tokenFile) {
		t.Errorf("String() = %q, want the URL with its path and query redacted and the token file's path", s)
	}
	if !strings.Contains(logged.String(), "tokenFile="+tokenFile) {
		t.Errorf("logged %q, want the sink's String", logged.String())
	}
}

// A token has no place in the file: only a token file's path. One written there anyway,
// under any field, refuses the file, and neither the error nor anything else shows it.
func TestTokensAreNeverInline(t *testing.T) {
	const token = "tok-inline-5e3c"
	for _, sink := range []string{
		"http: {url: 'https://h/x', token: " + token + "}",
		"http: {url: 'https://h/x', bearerToken: " + token + "}",
		"{name: x, token: " + token + ", http: {url: 'https://h/x'}}",
		"nats: {servers: [nats1], token: " + token + "}",
		"nats: {servers: [nats1], tokenFile: /t, password: " + token + "}",
		"kafka: {brokers: [k], topic: t, token: " + token + "}",
	} {
		_, err := Decode([]byte(sinksFile(sink)))
		if err == nil {
			t.Errorf("%s: decoded", sink)
			continue
		}
		if !strings.Contains(err.Error(), "unknown field") || strings.Contains(err.Error(), token) {
			t.Errorf("%s: error %q, want an unknown field without its value", sink, err)
		}
	}
	// In the receiver's URL it is redacted wherever the sink is shown.
	c := mustDecode(t, "http: {url: 'https://h/x?token="+token+"'}")
	for _, form := range []string{c.String(), c.Target(), c.Name(), c.LogValue().String(), fmt.Sprintf("%#v", c)} {
		if strings.Contains(form, token) {
			t.Errorf("%q shows the token", form)
		}
	}
}

// TestDefaultNamesHideTheURL: an HTTP sink without a name is named after its scheme,
// host and a digest of its path, never the path itself (Slack- and Discord-style
// webhook URLs carry their secret in the path). The name is the cursor's key and the
// metrics' label, so it stays the same across restarts and releases, tells apart two
// sinks on one host, and moves neither when an option of the sink's changes nor when a
// credential in the receiver's query is rotated.
func TestDefaultNamesHideTheURL(t *testing.T) {
	const hook = "https://hooks.example.com/services/T000/B000/XXXXsecretXXXX"
	tests := []struct {
		name   string
		url    string
		more   string // more fields of the http block
		want   string // the name; empty: only that it differs from the hook's
		target string // Target()
	}{
		{"a webhook's secret path", hook, "", "https://hooks.example.com#b887fb93", "https://hooks.example.com/REDACTED"},
		{"the sink's own options do not count", hook, ", timeout: 1s, mode: structured", "https://hooks.example.com#b887fb93", "https://hooks.example.com/REDACTED"},
		{"another path on the same host", "https://hooks.example.com/services/T000/B000/YYYYsecretYYYY", "", "", "https://hooks.example.com/REDACTED"},
		{"nor does the receiver's query", hook + "?sig=s3cret", "", "https://hooks.example.com#b887fb93", "https://hooks.example.com/REDACTED?sig=REDACTED"},
		{"no path", "http://receiver.example:8080", "", "", "http://receiver.example:8080"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sink := "http: {url: '" + tc.url + "'" + tc.more + "}"
			c := mustDecode(t, sink)
			name := c.Name()
			switch {
			case tc.want != "" && name != tc.want:
				t.Errorf("name %q, want %q", name, tc.want)
			case tc.want == "" && name == "https://hooks.example.com#b887fb93":
				t.Errorf("name %q is the hook's too", name)
			}
			if again := mustDecode(t, sink).Name(); again != name {
				t.Errorf("decoded again, the name is %q, not %q", again, name)
			}
			// --cloudevents-sink names the same sink the same: a sink moved from the
			// flag to the file keeps its cursor. (The flag takes no receiver's query.)
			if !strings.Contains(tc.url, "?") {
				if short := mustParse(t, tc.url).Name(); short != name {
					t.Errorf("as a URL, the name is %q, not %q", short, name)
				}
			}
			host := strings.SplitN(tc.url, "/", 4)[2]
			if !regexp.MustCompile(`^https?://` + regexp.QuoteMeta(host) + `#[0-9a-f]{8}$`).MatchString(name) {
				t.Errorf("name %q, want scheme://%s#<8 hex digits>", name, host)
			}
			if got := c.Target(); got != tc.target {
				t.Errorf("target %q, want %q", got, tc.target)
			}
			for _, secret := range []string{"secret", "s3cret", "T000"} {
				for _, form := range []string{name, c.Target(), c.String()} {
					if strings.Contains(form, secret) {
						t.Errorf("%q shows %q", form, secret)
					}
				}
			}
		})
	}
}

// Files are read when the sink opens (the relay opens it again until it can: a secret
// may be mounted late, and a token file is read again as it rotates).
func TestOpenRefusesUnreadableFiles(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	notPEM := filepath.Join(dir, "ca.txt")
	for _, f := range []string{empty, notPEM} {
		if err := os.WriteFile(f, []byte(map[string]string{empty: "", notPEM: "not a certificate"}[f]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ sink, want string }{
		{"http: {url: 'https://host/x', tokenFile: '" + filepath.Join(dir, "missing") + "'}", "reading tokenFile"},
		{"http: {url: 'https://host/x', tokenFile: '" + empty + "'}", "is empty"},
		{"http: {url: 'https://host/x', caFile: '" + notPEM + "'}", "holds no PEM certificate"},
		{"nats: {servers: ['127.0.0.1:1'], tokenFile: '" + empty + "'}", "is empty"},
		{"kafka: {brokers: ['127.0.0.1:1'], topic: t, caFile: '" + filepath.Join(dir, "missing") + "'}", "reading caFile"},
	}
	for _, tc := range tests {
		t.Run(tc.sink, func(t *testing.T) {
			s, err := mustDecode(t, tc.sink).Open(context.Background())
			if err == nil {
				s.Close()
				t.Fatalf("opened, want an error saying %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestZeroConfigDoesNotOpen(t *testing.T) {
	if _, err := (Config{}).Open(context.Background()); err == nil {
		t.Error("a zero Config opened")
	}
}

// TestParse: --cloudevents-sink's URL is the file's sink of that URL, servers and
// subject, or brokers and topic, and name.
func TestParse(t *testing.T) {
	tests := []struct{ raw, sink string }{
		{"http://receiver.example:8080/hook", "http: {url: 'http://receiver.example:8080/hook'}"},
		{"https://hooks.example.com/x?name=alerts", "{name: alerts, http: {url: 'https://hooks.example.com/x'}}"},
		{"nats://nats.example", "nats: {servers: [nats.example]}"},
		{"nats://n1:4222,n2:4223/flyte.events?name=nats", "{name: nats, nats: {servers: ['n1:4222', 'n2:4223'], subject: flyte.events}}"},
		{"kafka://k1,k2:9093/flyte-actions", "kafka: {brokers: [k1, 'k2:9093'], topic: flyte-actions}"},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			got, want := view(mustParse(t, tc.raw)), view(mustDecode(t, tc.sink))
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestParseRefuses: besides a URL that is no sink, the flag refuses every option but
// name=, and a receiver's own query, pointing to the file.
func TestParseRefuses(t *testing.T) {
	const toFile = "=: the flag takes a URL and name= only; write this sink in the --cloudevents-config file"
	tests := []struct{ raw, want string }{
		{"", "not a URL"},
		{"receiver.example/hook", "not a URL"},
		{"ftp://host/x", `unknown scheme "ftp"`},
		{"https://user:pw@host/x", "credentials in the URL"},
		{"nats://user:pw@host", "credentials are refused"},
		{"http://host/x#frag", "fragment"},
		{"nats://host#frag", "fragment"},
		{"http://host/x?a=%zz", "query"},
		{"http://host/x?mode=batch", "mode" + toFile},
		{"https://host/x?name=a&tokenfile=/t", "tokenfile" + toFile},
		{"http://host/x?sig=s3cret", "sig" + toFile},
		{"nats://nats:4222?subject=s&name=n", "subject" + toFile},
		{"kafka://k1?topic=t", "topic" + toFile},
		{"http://host/x?name=", "name=: want one"},
		{"http://host/x?name=a&name=b", "name=: want one"},
		{"kafka://host", "kafka.topic: required"},
		{"nats://host/a*", `nats.subject: "a*"`},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			c, err := Parse(tc.raw)
			if err == nil {
				t.Fatalf("parsed as %v, want an error saying %q", c, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one saying %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "cloudevents sink ") {
				t.Errorf("error %q does not name the sink", err)
			}
			for _, secret := range []string{"pw", "s3cret"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q shows a credential", err)
				}
			}
		})
	}
}
