package cloudevents

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

func TestParse(t *testing.T) {
	type want struct {
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
		projects, domains []string
		phases            []flytecorev1.ActionPhase
	}
	tests := []struct {
		raw  string
		want want
	}{
		{"http://receiver.example:8080/hook", want{
			kind: KindHTTP, name: "http://receiver.example:8080#3ccd089c", where: "http://receiver.example:8080/REDACTED", target: "http://receiver.example:8080/hook",
			mode: Binary, timeout: DefaultTimeout,
		}},
		{"https://receiver.example/hook?code=s3cret&mode=structured&timeout=250ms&name=audit&project=a,b&project=c&domain=production&phase=failed,TIMED_OUT", want{
			kind: KindHTTP, name: "audit", where: "https://receiver.example/REDACTED?code=REDACTED", target: "https://receiver.example/hook?code=s3cret",
			mode: Structured, timeout: 250 * time.Millisecond,
			projects: []string{"a", "b", "c"}, domains: []string{"production"},
			phases: []flytecorev1.ActionPhase{flytecorev1.ActionPhase_ACTION_PHASE_FAILED, flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT},
		}},
		{"https://[::1]:8443/?cafile=/etc/ca.pem&tokenfile=/var/run/token&topic=kept", want{
			kind: KindHTTP, name: "https://[::1]:8443#6a3d9800", where: "https://[::1]:8443/?topic=REDACTED", target: "https://[::1]:8443/?topic=kept", mode: Binary, timeout: DefaultTimeout,
		}},
		{"http://receiver.example/batch?mode=batch", want{
			kind: KindHTTP, name: "http://receiver.example#31b16609", where: "http://receiver.example/REDACTED", target: "http://receiver.example/batch",
			mode: Batched, batchSize: DefaultBatchSize, timeout: DefaultTimeout,
		}},
		{"http://receiver.example/batch?batchsize=1000&mode=batch", want{
			kind: KindHTTP, name: "http://receiver.example#31b16609", where: "http://receiver.example/REDACTED", target: "http://receiver.example/batch",
			mode: Batched, batchSize: 1000, timeout: DefaultTimeout,
		}},
		{"nats://nats.example", want{
			kind: KindNATS, name: "nats://nats.example:4222/flyte.actions", where: "nats://nats.example:4222/flyte.actions", servers: []string{"nats.example:4222"},
			subject: "flyte.actions", mode: Structured, timeout: DefaultTimeout,
		}},
		{"nats://n1:4222,n2:4223?subject=flyte.events&stream=FLYTE&mode=structured&phase=succeeded", want{
			kind: KindNATS, name: "nats://n1:4222,n2:4223/flyte.events", where: "nats://n1:4222,n2:4223/flyte.events", servers: []string{"n1:4222", "n2:4223"},
			subject: "flyte.events", stream: "FLYTE", mode: Structured, timeout: DefaultTimeout,
			phases: []flytecorev1.ActionPhase{flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED},
		}},
		{"kafka://k1,k2:9093?topic=flyte-actions", want{
			kind: KindKafka, name: "kafka://k1:9092,k2:9093/flyte-actions", where: "kafka://k1:9092,k2:9093/flyte-actions", servers: []string{"k1:9092", "k2:9093"},
			topic: "flyte-actions", mode: Binary, timeout: DefaultTimeout,
		}},
		{"kafka://[::1]:9092?topic=t&mode=structured&timeout=1m&name=k&domain=development", want{
			kind: KindKafka, name: "k", where: "kafka://[::1]:9092/t", servers: []string{"[::1]:9092"}, topic: "t", mode: Structured, timeout: time.Minute,
			domains: []string{"development"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			c, err := Parse(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			got := want{
				kind: c.Kind(), name: c.Name(), where: c.Target(), servers: c.servers, subject: c.subject, stream: c.stream, topic: c.topic,
				mode: c.Mode(), batchSize: c.BatchSize(), timeout: c.Timeout(), projects: c.projects, domains: c.domains, phases: c.phases,
			}
			if c.target != nil {
				got.target = c.target.String()
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"", "not a URL"},
		{"receiver.example/hook", "not a URL"},
		{"ftp://host/x", `unknown scheme "ftp"`},
		{"HTTP://host/x", `unknown scheme "HTTP"`},
		{"http:///path", "no host"},
		{"https://user:pw@host/x", "credentials in the URL"},
		{"nats://user:pw@host", "credentials in the URL"},
		{"http://host/x#frag", "fragment"},
		{"http://host/x?mode=text", `bad mode= "text"`},
		{"http://host/x?mode=binary&mode=structured", "mode= given 2 times"},
		{"http://host/x?batchsize=10", "batchsize= applies to mode=batch only"},
		{"http://host/x?mode=batch&batchsize=0", `bad batchsize= "0"`},
		{"http://host/x?mode=batch&batchsize=1001", `bad batchsize= "1001"`},
		{"kafka://host?topic=t&mode=batch", `bad mode= "batch" for a kafka sink: want binary or structured`},
		{"http://host/x?timeout=fast", `bad timeout= "fast"`},
		{"http://host/x?timeout=-1s", `bad timeout= "-1s"`},
		{"http://host/x?timeout=1h", `bad timeout= "1h"`},
		{"http://host/x?cafile=/ca.pem", "cafile= applies to https only"},
		{"http://host/x?tokenfile=", "empty tokenfile="},
		{"http://host/x?phase=done", `bad phase "done" in phase=: want one of queued, waiting_for_resources, initializing, running, succeeded, failed, aborted, timed_out`},
		{"http://host/x?phase=running,", `bad phase ""`},
		{"http://host/x?project=a,,b", `empty value in project=`},
		{"http://host/x?name=has space", `bad name=`},
		{"http://host/x?name=" + strings.Repeat("n", 201), "longer than 200"},
		{"http://host/x?a=%zz", "query"},
		{"nats://host?mode=binary", `bad mode= "binary" for a nats sink: want structured`},
		{"nats://host?subject=flyte.*", `bad subject= "flyte.*"`},
		{"nats://host?subject=a..b", `bad subject=`},
		{"nats://host?stream=A.B", `bad stream= "A.B"`},
		{"nats://host?topic=x", `unknown option "topic" for a nats sink`},
		{"nats://host/flyte.actions", `unexpected path "/flyte.actions": name the subject= in the query`},
		{"nats://", "no host"},
		{"nats://host:0", `bad port in "host:0"`},
		{"nats://host:x", `bad port in "host:x"`},
		{"nats://a,,b", `bad host ""`},
		{"kafka://host", "missing topic="},
		{"kafka://host/topic", `unexpected path "/topic": name the topic= in the query`},
		{"kafka://host?topic=a/b", `bad topic= "a/b"`},
		{"kafka://host?topic=t&tokenfile=/x", `unknown option "tokenfile" for a kafka sink`},
		{"kafka://host?topic=t&subject=s", `unknown option "subject"`},
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

func TestAccepts(t *testing.T) {
	running := actionEvent(0, 0)
	failed := actionEvent(0, 1)
	failed.Phase = flytecorev1.ActionPhase_ACTION_PHASE_FAILED
	other := actionEvent(0, 0)
	other.Id.Project, other.Id.Domain = "other", "production"

	tests := []struct {
		query string
		want  []bool // running, failed, other
	}{
		{"", []bool{true, true, true}},
		{"project=flytesnacks", []bool{true, true, false}},
		{"project=other&project=flytesnacks", []bool{true, true, true}},
		{"domain=production", []bool{false, false, true}},
		{"phase=failed,timed_out", []bool{false, true, false}},
		{"phase=running&project=other", []bool{false, false, true}},
		{"project=flytesnack", []bool{false, false, false}}, // exact, not a prefix
	}
	for _, tc := range tests {
		t.Run(tc.query, func(t *testing.T) {
			c := mustParse(t, "http://host/x?"+tc.query)
			got := []bool{c.Accepts(running), c.Accepts(failed), c.Accepts(other)}
			if !slices.Equal(got, tc.want) {
				t.Errorf("accepts %v, want %v", got, tc.want)
			}
		})
	}
}

// The configuration's printed forms never show a token, the receiver's query values or
// its path, which in webhook URLs is often the credential.
func TestConfigRedacts(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	const token = "tok-9f8e7d"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, "https://receiver.example/hooks/p4thsecret?sig=s3cret&tokenfile="+tokenFile)
	sink, err := c.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	for _, form := range []string{
		c.Name(), c.String(), c.Target(), fmt.Sprint(c), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%s", &c),
		fmt.Sprintf("%+v", sink), sink.Name(),
	} {
		for _, secret := range []string{"s3cret", token, "p4thsecret"} {
			if strings.Contains(form, secret) {
				t.Errorf("%q shows the secret %q", form, secret)
			}
		}
	}
	if s := c.String(); !strings.Contains(s, "https://receiver.example/REDACTED?sig=REDACTED") || !strings.Contains(s, "tokenfile="+tokenFile) {
		t.Errorf("String() = %q, want the URL with its path and query redacted and the token file's path", s)
	}
}

// TestDefaultNamesHideTheURL: an HTTP sink without name= is named after its scheme,
// host and a digest of its path, never the path itself (Slack- and Discord-style
// webhook URLs carry their secret in the path). The name is the cursor's key and the
// metrics' label, so it stays the same across restarts and releases, tells apart two
// sinks on one host, and moves neither when an option of the sink's changes nor when a
// credential in the receiver's query is rotated.
func TestDefaultNamesHideTheURL(t *testing.T) {
	const hook = "https://hooks.example.com/services/T000/B000/XXXXsecretXXXX"
	tests := []struct {
		name   string
		raw    string
		want   string // the name; empty: only that it differs from the hook's
		target string // Target()
	}{
		{"a webhook's secret path", hook, "https://hooks.example.com#b887fb93", "https://hooks.example.com/REDACTED"},
		{"the sink's own options do not count", hook + "?timeout=1s&mode=structured&phase=failed", "https://hooks.example.com#b887fb93", "https://hooks.example.com/REDACTED"},
		{"another path on the same host", "https://hooks.example.com/services/T000/B000/YYYYsecretYYYY", "", "https://hooks.example.com/REDACTED"},
		{"nor does the receiver's query", hook + "?sig=s3cret", "https://hooks.example.com#b887fb93", "https://hooks.example.com/REDACTED?sig=REDACTED"},
		{"no path", "http://receiver.example:8080", "", "http://receiver.example:8080"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.raw)
			name := c.Name()
			switch {
			case tc.want != "" && name != tc.want:
				t.Errorf("name %q, want %q", name, tc.want)
			case tc.want == "" && name == "https://hooks.example.com#b887fb93":
				t.Errorf("name %q is the hook's too", name)
			}
			if again := mustParse(t, tc.raw).Name(); again != name {
				t.Errorf("parsed again, the name is %q, not %q", again, name)
			}
			host := strings.SplitN(tc.raw, "/", 4)[2]
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

func TestOpenRefusesUnreadableFiles(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	notPEM := filepath.Join(dir, "ca.txt")
	for _, f := range []string{empty, notPEM} {
		if err := os.WriteFile(f, []byte(map[string]string{empty: "", notPEM: "not a certificate"}[f]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ raw, want string }{
		{"https://host/x?tokenfile=" + filepath.Join(dir, "missing"), "reading tokenfile"},
		{"https://host/x?tokenfile=" + empty, "is empty"},
		{"https://host/x?cafile=" + notPEM, "holds no PEM certificate"},
		{"nats://127.0.0.1:1?tokenfile=" + empty, "is empty"},
		{"kafka://127.0.0.1:1?topic=t&cafile=" + filepath.Join(dir, "missing"), "reading cafile"},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			s, err := mustParse(t, tc.raw).Open(context.Background())
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
