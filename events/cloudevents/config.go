package cloudevents

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
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
	// Batched (HTTP only) posts up to batchsize= events per request as a JSON array,
	// application/cloudevents-batch+json: one round trip for many events.
	Batched Mode = "batch"
)

// Defaults of the URL's options.
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

// Config is one sink's configuration, parsed from its URL (the --cloudevents-sink flag's
// value). Its String form redacts the receiver's query values; it never holds a token,
// only the path of the file that does.
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
	// batchSize bounds the events in one batched HTTP request (mode=batch).
	batchSize int
	timeout   time.Duration
	caFile    string
	// tokenFile holds a bearer token (HTTP) or a NATS token, read again as it rotates.
	tokenFile string

	projects, domains []string // nil: any
	phases            []flytecorev1.ActionPhase
}

// Name is the sink's stable name, its cursor's key and its metrics' label: the name=
// option, or one derived from the URL. For HTTP that is the scheme, the host and a
// digest of them with the path, as https://host#1a2b3c4d: a webhook URL's path is
// often its credential, and the name is shown to whoever reads the metrics. The query
// is left out, as it always was, so rotating a credential there keeps the cursor. For
// a broker it is its servers and subject or topic. Changing a derived name's parts
// gives the sink a new cursor, so set name= to keep a sink's place across a move.
func (c Config) Name() string { return c.name }

// LegacyName is the name an HTTP sink without name= had before default names left the
// path out: scheme, host and path. It holds the path, which may be a credential, so it
// is for finding what was kept under that name (a cursor, dead letters) and never for
// showing. It is empty when name= names the sink, and for the other kinds, whose
// default names have not changed.
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
// redacted.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s sink %q -> ", c.kind, c.name)
	switch c.kind {
	case KindHTTP:
		b.WriteString(redactedURL(c.target))
	case KindNATS:
		fmt.Fprintf(&b, "nats://%s subject=%s", strings.Join(c.servers, ","), c.subject)
		if c.stream != "" {
			fmt.Fprintf(&b, " stream=%s", c.stream)
		}
	case KindKafka:
		fmt.Fprintf(&b, "kafka://%s topic=%s", strings.Join(c.servers, ","), c.topic)
	}
	fmt.Fprintf(&b, " mode=%s timeout=%s", c.mode, c.timeout)
	if c.mode == Batched {
		fmt.Fprintf(&b, " batchsize=%d", c.batchSize)
	}
	if c.caFile != "" {
		fmt.Fprintf(&b, " cafile=%s", c.caFile)
	}
	if c.tokenFile != "" {
		fmt.Fprintf(&b, " tokenfile=%s", c.tokenFile)
	}
	if c.projects != nil {
		fmt.Fprintf(&b, " project=%s", strings.Join(c.projects, ","))
	}
	if c.domains != nil {
		fmt.Fprintf(&b, " domain=%s", strings.Join(c.domains, ","))
	}
	if c.phases != nil {
		names := make([]string, len(c.phases))
		for i, p := range c.phases {
			names[i], _ = PhaseName(p)
		}
		fmt.Fprintf(&b, " phase=%s", strings.Join(names, ","))
	}
	return b.String()
}

// GoString keeps %#v from printing the fields (the receiver's query among them).
func (c Config) GoString() string { return "cloudevents.Config(" + c.String() + ")" }

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
		return nil, errors.New("cloudevents: a zero Config; make one with Parse")
	}
	if err != nil {
		return nil, fmt.Errorf("cloudevents: opening %s sink %q: %w", c.kind, c.name, err)
	}
	return s, nil
}

// option is one query parameter that belongs to the sink.
type option struct {
	repeatable bool
	set        func(c *Config, value string) error
}

// Options every kind takes.
var commonOptions = map[string]option{
	"name":    {set: setName},
	"timeout": {set: setTimeout},
	"project": {repeatable: true, set: func(c *Config, v string) error { return addList(&c.projects, "project", v) }},
	"domain":  {repeatable: true, set: func(c *Config, v string) error { return addList(&c.domains, "domain", v) }},
	"phase":   {repeatable: true, set: addPhases},
}

var kindOptions = map[Kind]map[string]option{
	KindHTTP: {
		"mode":      {set: setMode(Binary, Structured, Batched)},
		"batchsize": {set: setBatchSize},
		"cafile":    {set: func(c *Config, v string) error { return setFile(&c.caFile, "cafile", v) }},
		"tokenfile": {set: func(c *Config, v string) error { return setFile(&c.tokenFile, "tokenfile", v) }},
	},
	KindNATS: {
		// Structured only: see the package comment.
		"mode":      {set: setMode(Structured)},
		"subject":   {set: setSubject},
		"stream":    {set: setStream},
		"cafile":    {set: func(c *Config, v string) error { return setFile(&c.caFile, "cafile", v) }},
		"tokenfile": {set: func(c *Config, v string) error { return setFile(&c.tokenFile, "tokenfile", v) }},
	},
	KindKafka: {
		"mode":   {set: setMode(Binary, Structured)},
		"topic":  {set: setTopic},
		"cafile": {set: func(c *Config, v string) error { return setFile(&c.caFile, "cafile", v) }},
	},
}

// Parse reads a sink's URL:
//
//	http://host[:port]/path?... or https://...  an HTTP receiver
//	nats://host[:port][,host[:port]...]?...       a JetStream subject
//	kafka://host[:port][,host[:port]...]?topic=T  a Kafka topic
//
// Options for every kind: name= (the cursor's key), timeout= (a Go duration, default
// 5s), and the filters project=, domain= (repeatable or comma-separated, exact) and
// phase= (comma-separated phase names: queued, waiting_for_resources, initializing,
// running, succeeded, failed, aborted, timed_out). HTTP: mode=binary|structured|batch
// (default binary), batchsize= (mode=batch: events per request, default 100, at most
// 1000), cafile= (https only), tokenfile= (a bearer token); other query
// parameters stay in the URL the receiver is called with. NATS: subject= (default
// flyte.actions), stream= (the stream the subject must be stored in), cafile= (TLS),
// tokenfile=. Kafka: topic= (required), mode=binary|structured (default binary),
// cafile= (TLS). Credentials in the URL itself are refused: they would show in logs.
func Parse(raw string) (Config, error) {
	c, err := parse(raw)
	if err != nil {
		return Config{}, fmt.Errorf("cloudevents sink %s: %w", describeRaw(raw), err)
	}
	return c, nil
}

func parse(raw string) (Config, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Config{}, errors.New("not a URL: want http://, https://, nats:// or kafka://")
	}
	c := Config{timeout: DefaultTimeout}
	var query string
	switch scheme {
	case "http", "https":
		c.kind = KindHTTP
		u, err := url.Parse(raw)
		if err != nil {
			return Config{}, err
		}
		if u.User != nil {
			return Config{}, errors.New("credentials in the URL are refused (they would show in logs); use tokenfile=")
		}
		if u.Host == "" || u.Hostname() == "" {
			return Config{}, errors.New("no host")
		}
		if u.Fragment != "" {
			return Config{}, errors.New("a fragment (#...) means nothing to a receiver")
		}
		query, u.RawQuery = u.RawQuery, ""
		c.target = u
		c.mode = Binary
	case "nats", "kafka":
		c.kind = Kind(scheme)
		authority, q, _ := strings.Cut(rest, "?")
		query = q
		if strings.Contains(authority, "#") || strings.Contains(query, "#") {
			return Config{}, errors.New("a fragment (#...) means nothing to a broker")
		}
		if strings.Contains(authority, "/") {
			what := "subject="
			if c.kind == KindKafka {
				what = "topic="
			}
			return Config{}, fmt.Errorf("unexpected path %q: name the %s in the query", authority[strings.Index(authority, "/"):], what)
		}
		servers, err := parseServers(authority, map[Kind]string{KindNATS: defaultNATSPort, KindKafka: defaultKafkaPort}[c.kind])
		if err != nil {
			return Config{}, err
		}
		c.servers = servers
		if c.kind == KindNATS {
			c.mode = Structured
			c.subject = DefaultNATSSubject
		} else {
			c.mode = Binary
		}
	default:
		return Config{}, fmt.Errorf("unknown scheme %q: want http, https, nats or kafka", scheme)
	}

	values, err := url.ParseQuery(query)
	if err != nil {
		return Config{}, fmt.Errorf("query: %w", err)
	}
	for _, k := range slices.Sorted(maps.Keys(values)) {
		opt, ok := commonOptions[k]
		if !ok {
			opt, ok = kindOptions[c.kind][k]
		}
		if !ok {
			if c.kind == KindHTTP {
				continue // the receiver's own parameter
			}
			return Config{}, fmt.Errorf("unknown option %q for a %s sink", k, c.kind)
		}
		if len(values[k]) > 1 && !opt.repeatable {
			return Config{}, fmt.Errorf("option %s= given %d times", k, len(values[k]))
		}
		for _, v := range values[k] {
			if err := opt.set(&c, v); err != nil {
				return Config{}, err
			}
		}
		delete(values, k)
	}
	if c.kind == KindHTTP {
		c.target.RawQuery = values.Encode()
		if c.caFile != "" && c.target.Scheme != "https" {
			return Config{}, errors.New("cafile= applies to https only")
		}
		switch {
		case c.mode == Batched && c.batchSize == 0:
			c.batchSize = DefaultBatchSize
		case c.mode != Batched && c.batchSize != 0:
			return Config{}, errors.New("batchsize= applies to mode=batch only")
		}
	}
	if c.kind == KindKafka && c.topic == "" {
		return Config{}, errors.New("missing topic= (the Kafka topic to produce to)")
	}
	if c.name == "" {
		c.name = c.defaultName()
	}
	if len(c.name) > maxNameLen {
		return Config{}, fmt.Errorf("the name %q is longer than %d bytes; set a shorter name=", c.name, maxNameLen)
	}
	return c, nil
}

func (c Config) defaultName() string {
	switch c.kind {
	case KindHTTP:
		return c.target.Scheme + "://" + c.target.Host + "#" + digest(c.pathName())
	case KindNATS:
		return "nats://" + strings.Join(c.servers, ",") + "/" + c.subject
	default:
		return "kafka://" + strings.Join(c.servers, ",") + "/" + c.topic
	}
}

// digest is the first 8 hex digits of the SHA-256 of s: enough to tell apart the sinks
// of one service, the same on every start and release, and nothing to read s from.
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}

// parseServers reads a broker URL's comma-separated host[:port] list.
func parseServers(authority, defaultPort string) ([]string, error) {
	if strings.Contains(authority, "@") {
		return nil, errors.New("credentials in the URL are refused (they would show in logs)")
	}
	if authority == "" {
		return nil, errors.New("no host")
	}
	var servers []string
	for _, hp := range strings.Split(authority, ",") {
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			// No port: the kind's default. A bare IPv6 address needs brackets.
			host, port = strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]"), defaultPort
		}
		if host == "" || strings.ContainsAny(host, " /?#[]") {
			return nil, fmt.Errorf("bad host %q", hp)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("bad port in %q", hp)
		}
		servers = append(servers, net.JoinHostPort(host, port))
	}
	return servers, nil
}

func setName(c *Config, v string) error {
	if v == "" || strings.IndexFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return fmt.Errorf("bad name= %q: want printable text without spaces", v)
	}
	c.name = v
	return nil
}

func setTimeout(c *Config, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > maxTimeout {
		return fmt.Errorf("bad timeout= %q: want a duration such as 5s, above 0 and at most %s", v, maxTimeout)
	}
	c.timeout = d
	return nil
}

func setMode(allowed ...Mode) func(c *Config, v string) error {
	return func(c *Config, v string) error {
		if !slices.Contains(allowed, Mode(v)) {
			return fmt.Errorf("bad mode= %q for a %s sink: want %s", v, c.kind, joinModes(allowed))
		}
		c.mode = Mode(v)
		return nil
	}
}

func setBatchSize(c *Config, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxBatchSize {
		return fmt.Errorf("bad batchsize= %q: want a number of events from 1 to %d", v, maxBatchSize)
	}
	c.batchSize = n
	return nil
}

func joinModes(modes []Mode) string {
	s := make([]string, len(modes))
	for i, m := range modes {
		s[i] = string(m)
	}
	return strings.Join(s, " or ")
}

func setFile(dst *string, opt, v string) error {
	if v == "" {
		return fmt.Errorf("empty %s=", opt)
	}
	*dst = v
	return nil
}

func addList(dst *[]string, opt, v string) error {
	for _, item := range strings.Split(v, ",") {
		if item == "" {
			return fmt.Errorf("empty value in %s= %q", opt, v)
		}
		if !slices.Contains(*dst, item) {
			*dst = append(*dst, item)
		}
	}
	slices.Sort(*dst)
	return nil
}

func addPhases(c *Config, v string) error {
	for _, name := range strings.Split(v, ",") {
		p, ok := phaseByName(strings.ToLower(name))
		if !ok {
			return fmt.Errorf("bad phase %q in phase=: want one of %s", name, strings.Join(phaseNames(), ", "))
		}
		if !slices.Contains(c.phases, p) {
			c.phases = append(c.phases, p)
		}
	}
	slices.Sort(c.phases)
	return nil
}

// NATS subjects: dot-separated tokens, no wildcards (a publish names one subject).
var natsToken = regexp.MustCompile(`^[^.\s*>]+(\.[^.\s*>]+)*$`)

func setSubject(c *Config, v string) error {
	if !natsToken.MatchString(v) {
		return fmt.Errorf("bad subject= %q: want dot-separated tokens without spaces or wildcards", v)
	}
	c.subject = v
	return nil
}

// NATS stream names: no spaces, dots, wildcards or path separators.
var natsStream = regexp.MustCompile(`^[^.\s*>/\\]+$`)

func setStream(c *Config, v string) error {
	if !natsStream.MatchString(v) {
		return fmt.Errorf("bad stream= %q: want a stream name without spaces, dots or wildcards", v)
	}
	c.stream = v
	return nil
}

// Kafka topic names: letters, digits, '.', '_' and '-', at most 249.
var kafkaTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func setTopic(c *Config, v string) error {
	if !kafkaTopic.MatchString(v) || v == "." || v == ".." {
		return fmt.Errorf("bad topic= %q: want letters, digits, '.', '_' and '-', at most 249", v)
	}
	c.topic = v
	return nil
}

// describeRaw names a sink URL in an error without its credentials or query values.
func describeRaw(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && !strings.Contains(u.Host, ",") {
		return strconv.Quote(redactedURL(u))
	}
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, _, _ := strings.Cut(rest, "?")
	if _, host, ok := strings.Cut(authority, "@"); ok {
		authority = "REDACTED@" + host
	}
	return strconv.Quote(scheme + "://" + authority)
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
		return nil, fmt.Errorf("reading cafile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("cafile %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// readToken reads a token file; tokens are rotated, so it is read again for each batch.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading tokenfile: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("tokenfile %s is empty", path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("tokenfile %s holds more than one line", path)
	}
	return tok, nil
}
