package cloudevents

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
)

// File is the sinks' configuration file (the events service's --cloudevents-config):
//
//	sinks:
//	  - name: alerts
//	    http: {url: https://hooks.example.com/flyte, mode: batch, tokenFile: /etc/flyte/hook.token}
//	    filter: {phases: [failed, timed_out]}
//	  - name: nats
//	    nats: {servers: [nats:4222], subject: flyte.actions, stream: FLYTE_ACTIONS}
//	  - name: kafka
//	    kafka: {brokers: [broker-1:9092, broker-2:9092], topic: flyte-actions}
//
// Decoding is strict: a field the file does not define, or one given twice, is an
// error. No field holds a secret: a token is read from the file tokenFile names.
type File struct {
	Sinks []SinkSpec `json:"sinks"`
}

// SinkSpec is one sink of the file: exactly one of HTTP, NATS and Kafka, and what it
// lets through.
type SinkSpec struct {
	// Name is the sink's cursor's key and its metrics' sink label (Config.Name): set it,
	// or it is derived from where the sink publishes, and moving it makes a new sink.
	Name   string      `json:"name,omitempty"`
	HTTP   *HTTPSpec   `json:"http,omitempty"`
	NATS   *NATSSpec   `json:"nats,omitempty"`
	Kafka  *KafkaSpec  `json:"kafka,omitempty"`
	Filter *FilterSpec `json:"filter,omitempty"`
}

// HTTPSpec is an HTTP receiver.
type HTTPSpec struct {
	// URL is the receiver's http:// or https:// URL, its own query included; no user
	// information (use TokenFile).
	URL string `json:"url"`
	// Mode is binary (the default), structured or batch.
	Mode Mode `json:"mode,omitempty"`
	// BatchSize bounds the events of one request in mode batch: default 100, at most 1000.
	BatchSize int `json:"batchSize,omitempty"`
	// Timeout bounds one request: a Go duration, default 5s, at most 10m.
	Timeout string `json:"timeout,omitempty"`
	// CAFile is the PEM CA to trust (https only); TokenFile holds a bearer token, read
	// again as it rotates.
	CAFile    string `json:"caFile,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
}

// NATSSpec is a JetStream subject. Its messages are structured (see the package comment).
type NATSSpec struct {
	// Servers are host[:port] seeds, port 4222 by default.
	Servers []string `json:"servers"`
	// Subject is published to (default flyte.actions); Stream, when set, is the stream
	// that must store it. The sink never creates a stream.
	Subject string `json:"subject,omitempty"`
	Stream  string `json:"stream,omitempty"`
	// Timeout bounds the wait for an acknowledgement.
	Timeout   string `json:"timeout,omitempty"`
	CAFile    string `json:"caFile,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
}

// KafkaSpec is a Kafka topic.
type KafkaSpec struct {
	// Brokers are host[:port] seeds, port 9092 by default.
	Brokers []string `json:"brokers"`
	Topic   string   `json:"topic"`
	// Mode is binary (the default) or structured.
	Mode Mode `json:"mode,omitempty"`
	// Timeout bounds the wait for a record's acknowledgement.
	Timeout string `json:"timeout,omitempty"`
	CAFile  string `json:"caFile,omitempty"`
}

// FilterSpec lets through only the events of these projects, domains and phases (exact
// names; phases as PhaseName gives them). A list left out takes all; the events filtered
// out count as handled for the sink.
type FilterSpec struct {
	Projects []string `json:"projects,omitempty"`
	Domains  []string `json:"domains,omitempty"`
	Phases   []string `json:"phases,omitempty"`
}

// Load reads the sinks' configuration file at path (see File).
func Load(path string) ([]Config, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		var sinks []Config
		if sinks, err = Decode(data); err == nil {
			return sinks, nil
		}
	}
	return nil, fmt.Errorf("%s: %w", path, err)
}

// Decode reads a sinks' configuration file (see File). Its errors name the sink, by
// index and name, and the field.
func Decode(data []byte) ([]Config, error) {
	doc, err := yaml.YAMLToJSONStrict(data) // refuses a key given twice
	if err != nil {
		return nil, err
	}
	var file struct {
		Sinks []json.RawMessage `json:"sinks"`
	}
	if bytes.HasPrefix(bytes.TrimSpace(doc), []byte("[")) {
		return nil, errors.New("a list: want a mapping with a sinks: list")
	}
	if err := strictJSON(doc, &file); err != nil {
		return nil, err
	}
	if file.Sinks == nil {
		return nil, errors.New("no sinks: list (write sinks: [] for none)")
	}
	sinks := make([]Config, len(file.Sinks))
	named := map[string]int{}
	for i, raw := range file.Sinks {
		var spec SinkSpec
		_ = json.Unmarshal(raw, &struct{ Name *string }{&spec.Name}) // to name the sink in an error
		where := fmt.Sprintf("sinks[%d]", i)
		if spec.Name != "" {
			where += " " + strconv.Quote(spec.Name)
		}
		err := strictJSON(raw, &spec)
		if err == nil {
			sinks[i], err = spec.Config()
		}
		if err == nil {
			if j, dup := named[sinks[i].name]; dup {
				err = fmt.Errorf("name: sinks[%d] has it too (%q): give one a name of its own", j, sinks[i].name)
			}
			named[sinks[i].name] = i
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	return sinks, nil
}

// strictJSON decodes data into v, refusing fields v does not define (matched with
// their case) and fields given twice.
func strictJSON(data []byte, v any) error {
	strict, err := kjson.UnmarshalStrict(data, v)
	return errors.Join(append([]error{err}, strict...)...)
}

// Config checks the sink and makes its Config. Its errors name the field, as the file
// does (http.batchSize, filter.phases).
func (s SinkSpec) Config() (Config, error) {
	var (
		c       Config
		timeout string
		err     error
	)
	switch {
	case s.HTTP != nil && (s.NATS != nil || s.Kafka != nil), s.NATS != nil && s.Kafka != nil:
		return Config{}, errors.New("want one of http, nats and kafka, not two")
	case s.HTTP != nil:
		timeout, err = s.HTTP.Timeout, c.setHTTP(*s.HTTP)
	case s.NATS != nil:
		timeout, err = s.NATS.Timeout, c.setNATS(*s.NATS)
	case s.Kafka != nil:
		timeout, err = s.Kafka.Timeout, c.setKafka(*s.Kafka)
	default:
		return Config{}, errors.New("want one of http, nats and kafka")
	}
	if err != nil {
		return Config{}, err
	}
	c.timeout = DefaultTimeout
	if timeout != "" {
		if c.timeout, err = time.ParseDuration(timeout); err != nil || c.timeout <= 0 || c.timeout > maxTimeout {
			return Config{}, fmt.Errorf("%s.timeout: %q: want a duration such as 5s, above 0 and at most %s", c.kind, timeout, maxTimeout)
		}
	}
	if f := s.Filter; f != nil {
		if c.projects, err = nameList("filter.projects", "project", f.Projects); err != nil {
			return Config{}, err
		}
		if c.domains, err = nameList("filter.domains", "domain", f.Domains); err != nil {
			return Config{}, err
		}
		if c.phases, err = phaseList(f.Phases); err != nil {
			return Config{}, err
		}
	}
	c.name = cmp.Or(s.Name, c.defaultName())
	switch {
	case strings.IndexFunc(c.name, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
		return Config{}, fmt.Errorf("name: %q: want printable text without spaces", c.name)
	case len(c.name) > maxNameLen:
		return Config{}, fmt.Errorf("name: longer than %d bytes (%q); set a shorter one", maxNameLen, c.name)
	}
	return c, nil
}

// urlForm is what --cloudevents-sink once took as the sink's options in an HTTP URL's
// query: the file refuses them there, where they would go to the receiver unnoticed.
var urlForm = []string{"name", "timeout", "project", "domain", "phase", "mode", "batchsize", "cafile", "tokenfile"}

func (c *Config) setHTTP(h HTTPSpec) error {
	c.kind, c.caFile, c.tokenFile = KindHTTP, h.CAFile, h.TokenFile
	if h.URL == "" {
		return errors.New("http.url: required")
	}
	// The errors do not show the URL: its path and query may be credentials.
	u, err := url.Parse(h.URL)
	if err != nil {
		return fmt.Errorf("http.url: %w", errors.Unwrap(err))
	}
	query, err := url.ParseQuery(u.RawQuery)
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("http.url: want an http:// or https:// URL")
	case u.User != nil:
		return errors.New("http.url: credentials in the URL are refused (they would show in logs); use tokenFile")
	case u.Hostname() == "":
		return errors.New("http.url: no host")
	case u.Fragment != "":
		return errors.New("http.url: a fragment (#...) means nothing to a receiver")
	case err != nil:
		return fmt.Errorf("http.url: its query: %w", err)
	}
	for _, k := range urlForm {
		if query.Has(k) {
			return fmt.Errorf("http.url: the query's %s= was a sink's option in the URL form: set it in the file (the receiver would get it)", k)
		}
	}
	c.target = u
	c.mode = cmp.Or(h.Mode, Binary)
	if !slices.Contains([]Mode{Binary, Structured, Batched}, c.mode) {
		return fmt.Errorf("http.mode: %q: want binary, structured or batch", c.mode)
	}
	switch {
	case c.mode != Batched && h.BatchSize != 0:
		return errors.New("http.batchSize: applies to mode batch only")
	case c.mode == Batched && h.BatchSize == 0:
		c.batchSize = DefaultBatchSize
	case c.mode == Batched && (h.BatchSize < 1 || h.BatchSize > maxBatchSize):
		return fmt.Errorf("http.batchSize: %d: want a number of events from 1 to %d", h.BatchSize, maxBatchSize)
	default:
		c.batchSize = h.BatchSize
	}
	if c.caFile != "" && u.Scheme != "https" {
		return errors.New("http.caFile: applies to https only")
	}
	return nil
}

// NATS subjects: dot-separated tokens, no wildcards (a publish names one subject).
var natsToken = regexp.MustCompile(`^[^.\s*>]+(\.[^.\s*>]+)*$`)

// NATS stream names: no spaces, dots, wildcards or path separators.
var natsStream = regexp.MustCompile(`^[^.\s*>/\\]+$`)

func (c *Config) setNATS(n NATSSpec) (err error) {
	c.kind, c.mode, c.caFile, c.tokenFile = KindNATS, Structured, n.CAFile, n.TokenFile
	if c.servers, err = hostPorts("nats.servers", n.Servers, defaultNATSPort); err != nil {
		return err
	}
	c.subject, c.stream = cmp.Or(n.Subject, DefaultNATSSubject), n.Stream
	if !natsToken.MatchString(c.subject) {
		return fmt.Errorf("nats.subject: %q: want dot-separated tokens without spaces or wildcards", c.subject)
	}
	if c.stream != "" && !natsStream.MatchString(c.stream) {
		return fmt.Errorf("nats.stream: %q: want a stream name without spaces, dots or wildcards", c.stream)
	}
	return nil
}

// Kafka topic names: letters, digits, '.', '_' and '-', at most 249.
var kafkaTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func (c *Config) setKafka(k KafkaSpec) (err error) {
	c.kind, c.caFile, c.topic = KindKafka, k.CAFile, k.Topic
	if c.servers, err = hostPorts("kafka.brokers", k.Brokers, defaultKafkaPort); err != nil {
		return err
	}
	switch {
	case c.topic == "":
		return errors.New("kafka.topic: required (the Kafka topic to produce to)")
	case !kafkaTopic.MatchString(c.topic) || c.topic == "." || c.topic == "..":
		return fmt.Errorf("kafka.topic: %q: want letters, digits, '.', '_' and '-', at most 249", c.topic)
	}
	c.mode = cmp.Or(k.Mode, Binary)
	if c.mode != Binary && c.mode != Structured {
		return fmt.Errorf("kafka.mode: %q: want binary or structured", c.mode)
	}
	return nil
}

// hostPorts checks a broker's host[:port] seeds, giving each its port.
func hostPorts(field string, seeds []string, defaultPort string) ([]string, error) {
	if len(seeds) == 0 {
		return nil, fmt.Errorf("%s: want at least one host[:port]", field)
	}
	out := make([]string, len(seeds))
	for i, hp := range seeds {
		if strings.Contains(hp, "@") {
			return nil, fmt.Errorf("%s: credentials are refused (they would show in logs)", field)
		}
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			// No port: the kind's default. A bare IPv6 address needs brackets.
			host, port = strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]"), defaultPort
		}
		if host == "" || strings.ContainsAny(host, " /?#[],") {
			return nil, fmt.Errorf("%s: bad host %q: want host[:port]", field, hp)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s: bad port in %q", field, hp)
		}
		out[i] = net.JoinHostPort(host, port)
	}
	return out, nil
}

// nameList checks a filter's names: sorted, each once.
func nameList(field, what string, names []string) ([]string, error) {
	if names == nil {
		return nil, nil
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: an empty list takes nothing: leave it out to take every %s", field, what)
	}
	if slices.Contains(names, "") {
		return nil, fmt.Errorf("%s: an empty name", field)
	}
	return slices.Compact(slices.Sorted(slices.Values(names))), nil
}

// phaseList checks a filter's phases, by name: sorted, each once.
func phaseList(names []string) (phases []flytecorev1.ActionPhase, err error) {
	if names != nil && len(names) == 0 {
		return nil, errors.New("filter.phases: an empty list takes nothing: leave it out to take every phase")
	}
	for _, name := range names {
		p, ok := phaseByName(strings.ToLower(name))
		if !ok {
			return nil, fmt.Errorf("filter.phases: %q: want one of %s", name, strings.Join(phaseNames(), ", "))
		}
		phases = append(phases, p)
	}
	slices.Sort(phases)
	return slices.Compact(phases), nil
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
