package cloudevents

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// Kind is the kind of receiver a sink publishes to.
type Kind string

const (
	KindHTTP  Kind = "http" // http:// and https://
	KindNATS  Kind = "nats"
	KindKafka Kind = "kafka"
)

// Mode is the CloudEvents content mode of a sink's messages.
type Mode string

const (
	// Binary puts the attributes in protocol headers (HTTP ce-*, Kafka ce_*) and the
	// data, as is, in the body.
	Binary Mode = "binary"
	// Structured puts the whole event in the body as application/cloudevents+json.
	Structured Mode = "structured"
	// Batched (HTTP only) posts up to batchSize events per request as a JSON array,
	// application/cloudevents-batch+json: one round trip for many events.
	Batched Mode = "batch"
)

// Defaults and bounds of a sink's settings.
const (
	DefaultTimeout     = 5 * time.Second
	DefaultNATSSubject = "flyte.actions"
	defaultNATSPort    = "4222"
	defaultKafkaPort   = "9092"
	maxTimeout         = 10 * time.Minute
	// DefaultBatchSize is how many events a batched HTTP request carries at most.
	DefaultBatchSize = 100
	maxBatchSize     = 1000
	maxNameLen       = 200
)

// Config is one sink's configuration, checked: from the configuration file (Load,
// Decode, SinkSpec.Config) or --cloudevents-sink's URL (Parse). Its String form redacts the receiver's
// path and query values; it never holds a token, only the path of the file that does.
type Config struct {
	kind Kind
	name string
	// target is the HTTP receiver's URL, without the options that belong to the sink.
	target *url.URL
	// servers are a broker's host:port seeds (NATS, Kafka).
	servers []string
	subject string // NATS
	stream  string // NATS: the stream the subject must be stored in, when set
	topic   string // Kafka
	mode    Mode
	// batchSize bounds the events in one batched HTTP request (mode batch).
	batchSize int
	timeout   time.Duration
	caFile    string
	// tokenFile holds a bearer token (HTTP) or a NATS token, read again as it rotates.
	tokenFile string

	projects, domains []string // nil: any
	phases            []flytecorev1.ActionPhase
}

// Name is the sink's stable name, its cursor's key and its metrics' label: the name
// it is given, or one derived from where it publishes. For HTTP that is the scheme,
// the host and a digest of them with the path, as https://host#1a2b3c4d: a webhook
// URL's path is often its credential, and the name is shown to whoever reads the
// metrics. The query is left out, as it always was, so rotating a credential there
// keeps the cursor. For a broker it is its servers and subject or topic. Changing a
// derived name's parts gives the sink a new cursor, so name a sink to keep its place
// across a move.
func (c Config) Name() string { return c.name }

// LegacyName is the name an HTTP sink without a name of its own had before default
// names left the path out: scheme, host and path. It holds the path, which may be a
// credential, so it is for finding what was kept under that name (a cursor, dead
// letters) and never for showing. It is empty for a named sink, and for the other
// kinds, whose default names have not changed.
func (c Config) LegacyName() string {
	if c.kind != KindHTTP || c.name != c.defaultName() {
		return ""
	}
	return c.pathName()
}

// pathName is an HTTP sink's scheme, host and path: its default name before the path
// was left out, and what its default name digests.
func (c Config) pathName() string {
	return c.target.Scheme + "://" + c.target.Host + c.target.EscapedPath()
}

// Target is where the sink publishes, without credentials, options or anything that
// may be one: an HTTP receiver's scheme and host, with its path and its own query's
// values replaced by REDACTED; a broker's servers and its subject or topic, as
// nats://host:port/subject or kafka://host:port,host:port/topic.
func (c Config) Target() string {
	switch c.kind {
	case "":
		return ""
	case KindHTTP:
		return redactedURL(c.target)
	}
	return c.defaultName()
}

// RedactKept returns what replaces the sink's secrets in a detail kept before details
// were redacted: its URL's and its current token's (an earlier token is not known).
// It reads the token file once, now.
func (c Config) RedactKept() func(detail string) string {
	s := secrets(urlSecrets(c.target))
	if c.tokenFile != "" {
		if tok, err := readToken(c.tokenFile); err == nil {
			s = append(s, tok)
		}
	}
	// A kept detail may have been cut in the middle of a secret.
	return func(detail string) string { return s.redact(detail, true) }
}

// Kind is the kind of receiver.
func (c Config) Kind() Kind { return c.kind }

// Mode is the content mode of the sink's messages.
func (c Config) Mode() Mode { return c.mode }

// BatchSize is the most events one request carries in batched mode (0 otherwise).
func (c Config) BatchSize() int { return c.batchSize }

// Timeout bounds one HTTP request, or the wait for a broker's acknowledgement.
func (c Config) Timeout() time.Duration { return c.timeout }

// Accepts reports whether the sink's filters let ev through. An event filtered out
// counts as handled for the sink.
func (c Config) Accepts(ev *eventsv1.ActionEvent) bool {
	if c.projects != nil && !slices.Contains(c.projects, ev.GetId().GetProject()) {
		return false
	}
	if c.domains != nil && !slices.Contains(c.domains, ev.GetId().GetDomain()) {
		return false
	}
	if c.phases != nil && !slices.Contains(c.phases, ev.GetPhase()) {
		return false
	}
	return true
}

// String describes the sink for logs, with the receiver's path and query values
// redacted, in the file's terms.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s sink %q -> %s", c.kind, c.name, c.Target())
	if c.stream != "" {
		fmt.Fprintf(&b, " stream=%s", c.stream)
	}
	fmt.Fprintf(&b, " mode=%s", c.mode)
	if c.mode == Batched {
		fmt.Fprintf(&b, " batchSize=%d", c.batchSize)
	}
	fmt.Fprintf(&b, " timeout=%s", c.timeout)
	for _, f := range [][2]string{{"caFile", c.caFile}, {"tokenFile", c.tokenFile}, {"projects", strings.Join(c.projects, ",")}, {"domains", strings.Join(c.domains, ",")}} {
		if f[1] != "" {
			fmt.Fprintf(&b, " %s=%s", f[0], f[1])
		}
	}
	if c.phases != nil {
		names := make([]string, len(c.phases))
		for i, p := range c.phases {
			names[i], _ = PhaseName(p)
		}
		fmt.Fprintf(&b, " phases=%s", strings.Join(names, ","))
	}
	return b.String()
}

// GoString keeps %#v from printing the fields (the receiver's query among them).
func (c Config) GoString() string { return "cloudevents.Config(" + c.String() + ")" }

// LogValue logs the sink as its String, with any slog handler (JSON's would otherwise
// show nothing of it).
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Open makes the sink. It does not wait for the receiver or broker, which may be down
// when the service starts (the sink's Publish reports Retry until it is up); it fails
// only for what no retry mends, such as an unreadable CA or token file.
func (c Config) Open(ctx context.Context) (Sink, error) {
	var (
		s   Sink
		err error
	)
	switch c.kind {
	case KindHTTP:
		s, err = openHTTP(c)
	case KindNATS:
		s, err = openNATS(ctx, c)
	case KindKafka:
		s, err = openKafka(c)
	default:
		return nil, errors.New("cloudevents: a zero Config; make one with Decode, SinkSpec.Config or Parse")
	}
	if err != nil {
		return nil, fmt.Errorf("cloudevents: opening %s sink %q: %w", c.kind, c.name, err)
	}
	return s, nil
}

// redacted replaces what a sink's text must not show.
const redacted = "REDACTED"

// redactedURL is u with its user information, path (an opaque one too) and query
// values replaced: a webhook URL's path is often its credential. A path of "/" stays.
func redactedURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	r := *u
	if r.User != nil {
		r.User = url.User(redacted)
	}
	if r.Path != "" && r.Path != "/" {
		r.Path, r.RawPath = "/"+redacted, ""
	}
	r.Opaque = ""
	if r.RawQuery != "" {
		q := r.Query()
		for k := range q {
			q[k] = []string{redacted}
		}
		r.RawQuery = q.Encode()
	}
	r.Fragment, r.RawFragment = "", ""
	return r.String()
}

// Secrets of a URL shorter than these are not looked for in a receiver's answer: they
// are no credential worth the name, and replacing them would garble the text.
const (
	minQuerySecret   = 4 // a query value, or the whole path
	minSegmentSecret = 8 // one segment of the path
)

// urlSecrets are the parts of u that may be credentials, in the forms a receiver may
// echo them: its password, its query's values, its path and the path's longer
// segments, each as sent (escaped) and decoded.
func urlSecrets(u *url.URL) []string {
	if u == nil {
		return nil
	}
	var out []string
	add := func(minLen int, values ...string) {
		for _, v := range values {
			if len(v) >= minLen {
				out = append(out, v)
			}
		}
	}
	if pw, ok := u.User.Password(); ok {
		add(1, pw, url.QueryEscape(pw))
	}
	for _, values := range u.Query() {
		for _, v := range values {
			add(minQuerySecret, v, url.QueryEscape(v))
		}
	}
	if u.Path != "/" {
		add(minQuerySecret, u.Path, u.EscapedPath())
	}
	for _, path := range []string{u.Path, u.EscapedPath()} {
		add(minSegmentSecret, strings.Split(path, "/")...)
	}
	return out
}

// tlsConfig is a TLS configuration that trusts only caFile's certificates, or nil (the
// system's roots) without a file.
func tlsConfig(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading caFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("caFile %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// readToken reads a token file; tokens are rotated, so it is read again for each batch.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading tokenFile: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("tokenFile %s is empty", path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("tokenFile %s holds more than one line", path)
	}
	return tok, nil
}
