package cloudevents

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Parse reads the events service's --cloudevents-sink: one sink as a URL,
//
//	http://host[:port]/path or https://...        an HTTP receiver
//	nats://host[:port][,host[:port]...][/subject]  a JetStream subject
//	kafka://host[:port][,host[:port]...]/topic     a Kafka topic
//
// with name= and no other query. It is the file's sink (SinkSpec) of that URL, servers
// and subject, or brokers and topic, with the file's rules and defaults; anything more,
// a receiver's own query included, is written in the file.
func Parse(raw string) (Config, error) {
	s, err := shorthand(raw)
	var c Config
	if err == nil {
		c, err = s.Config()
	}
	if err != nil {
		return Config{}, fmt.Errorf("cloudevents sink %s: %w", describeRaw(raw), err)
	}
	return c, nil
}

// shorthand spells a --cloudevents-sink URL as the file's sink.
func shorthand(raw string) (SinkSpec, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return SinkSpec{}, errors.New("not a URL: want http://, https://, nats:// or kafka://")
	}
	if strings.Contains(rest, "#") {
		return SinkSpec{}, errors.New("a fragment (#...) means nothing to a sink")
	}
	authority, query, _ := strings.Cut(rest, "?")
	values, err := url.ParseQuery(query)
	if err != nil {
		return SinkSpec{}, fmt.Errorf("query: %w", err)
	}
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if k != "name" {
			return SinkSpec{}, fmt.Errorf("%s=: the flag takes a URL and name= only; write this sink in the --cloudevents-config file (docs/events.md)", k)
		}
	}
	if names, ok := values["name"]; ok && (len(names) != 1 || names[0] == "") {
		return SinkSpec{}, errors.New("name=: want one, not empty")
	}
	s := SinkSpec{Name: values.Get("name")}
	hosts, path, _ := strings.Cut(authority, "/")
	switch scheme {
	case "http", "https":
		s.HTTP = &HTTPSpec{URL: scheme + "://" + authority}
	case "nats":
		s.NATS = &NATSSpec{Servers: strings.Split(hosts, ","), Subject: path}
	case "kafka":
		s.Kafka = &KafkaSpec{Brokers: strings.Split(hosts, ","), Topic: path}
	default:
		return SinkSpec{}, fmt.Errorf("unknown scheme %q: want http, https, nats or kafka", scheme)
	}
	return s, nil
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
