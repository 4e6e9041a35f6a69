package cloudevents

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Parse reads a sink given as one URL, for a sink made in a line (ParseShort, tests):
//
//	http://host[:port]/path or https://...        an HTTP receiver
//	nats://host[:port][,host[:port]...][/subject]  a JetStream subject
//	kafka://host[:port][,host[:port]...][/topic]   a Kafka topic
//
// Query parameters named after a setting of the sink set it, as its field in the file
// (File) does: name=, timeout=, mode=, batchsize=, cafile=, tokenfile=, subject=,
// stream=, topic=, and the filters project=, domain= and phase= (repeatable or
// comma-separated). An HTTP URL's other parameters are the receiver's; a broker's are
// refused. The rules are the file's (SinkSpec.Config).
func Parse(raw string) (Config, error) {
	s, err := specOfURL(raw)
	var c Config
	if err == nil {
		c, err = s.Config()
	}
	if err != nil {
		return Config{}, fmt.Errorf("cloudevents sink %s: %w", describeRaw(raw), err)
	}
	return c, nil
}

// ParseShort is Parse with no option but name=: the events service's --cloudevents-sink.
// A sink with more to say, or a receiver's URL with a query, is written in the file.
func ParseShort(raw string) (Config, error) {
	_, query, _ := strings.Cut(raw, "?")
	values, _ := url.ParseQuery(query) // Parse reports a bad one
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if k != "name" {
			return Config{}, fmt.Errorf("cloudevents sink %s: %s=: the flag takes a URL and name= only; write this sink in the --cloudevents-config file (docs/events.md)", describeRaw(raw), k)
		}
	}
	return Parse(raw)
}

// specOfURL spells a URL as the file's sink: its options become the fields of the
// same name, decoded as the file's, so a kind without the option refuses it.
func specOfURL(raw string) (SinkSpec, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	kind := map[string]string{"http": "http", "https": "http", "nats": "nats", "kafka": "kafka"}[scheme]
	switch {
	case !ok:
		return SinkSpec{}, errors.New("not a URL: want http://, https://, nats:// or kafka://")
	case kind == "":
		return SinkSpec{}, fmt.Errorf("unknown scheme %q: want http, https, nats or kafka", scheme)
	case strings.Contains(rest, "#"):
		return SinkSpec{}, errors.New("a fragment (#...) means nothing to a sink")
	}
	authority, query, _ := strings.Cut(rest, "?")
	values, err := url.ParseQuery(query)
	if err != nil {
		return SinkSpec{}, fmt.Errorf("query: %w", err)
	}
	block, filter := map[string]any{}, map[string]any{}
	sink := map[string]any{kind: block}
	if kind != "http" {
		// nats://host:port,host:port/subject, kafka://host:port/topic
		authority, path, _ := strings.Cut(authority, "/")
		block[map[string]string{"nats": "servers", "kafka": "brokers"}[kind]] = strings.Split(authority, ",")
		if path != "" {
			block[map[string]string{"nats": "subject", "kafka": "topic"}[kind]] = path
		}
	}
	for _, k := range slices.Sorted(maps.Keys(values)) {
		vs := values[k]
		switch {
		case k == "project" || k == "domain" || k == "phase":
			var items []string
			for _, v := range vs {
				items = append(items, strings.Split(v, ",")...)
			}
			filter[k+"s"] = items
			delete(values, k)
			continue
		case kind == "http" && !slices.Contains(urlForm, k):
			continue // the receiver's own
		case len(vs) > 1:
			return SinkSpec{}, fmt.Errorf("option %s= given %d times", k, len(vs))
		case vs[0] == "":
			return SinkSpec{}, fmt.Errorf("empty %s=", k)
		}
		field, v := cmp.Or(map[string]string{"batchsize": "batchSize", "cafile": "caFile", "tokenfile": "tokenFile"}[k], k), any(vs[0])
		if field == "batchSize" {
			if v, err = strconv.Atoi(vs[0]); err != nil {
				return SinkSpec{}, fmt.Errorf("bad batchsize= %q: want a number", vs[0])
			}
		}
		if _, dup := block[field]; dup {
			return SinkSpec{}, fmt.Errorf("the %s twice: in the path and in %s=", field, k)
		}
		if k == "name" {
			sink[k] = v
		} else {
			block[field] = v
		}
		delete(values, k)
	}
	if kind == "http" {
		u := scheme + "://" + authority
		if len(values) > 0 {
			u += "?" + values.Encode() // the receiver's own
		}
		block["url"] = u
	}
	if len(filter) > 0 {
		sink["filter"] = filter
	}
	data, err := json.Marshal(sink)
	var s SinkSpec
	if err == nil {
		err = strictJSON(data, &s)
	}
	return s, err
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
