package console

import (
	"cmp"
	"container/heap"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/flytekube/backend/internal/textbound"
)

// Jaeger's /api/traces answer is {"data": [trace, ...]}, each trace
// {"traceID", "spans": [...], "processes": {...}}. It is read a token at a time and a
// span at a time, never whole: a lookup holds the spans it keeps and the one it reads.

// readTraces reads Jaeger's answer from r, keeping the traces (at most maxTraces) that
// have a span naming the action.
func readTraces(r io.Reader, want map[string]string) ([]trace, error) {
	dec := json.NewDecoder(r)
	out := []trace{}
	err := eachField(dec, func(key string) error {
		if key != "data" {
			return skipValue(dec)
		}
		return eachElement(dec, func() error {
			tr, named, err := readTrace(dec, want)
			if err != nil {
				return err
			}
			if named && traceIDPattern.MatchString(tr.TraceID) && len(out) < maxTraces {
				out = append(out, tr)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readTrace reads one trace, keeping its earliest spans, and reports whether one of all
// its spans names the action.
func readTrace(dec *json.Decoder, want map[string]string) (tr trace, named bool, err error) {
	var kept earliest
	services := map[string]string{}
	err = eachField(dec, func(key string) error {
		switch key {
		case "traceID":
			return dec.Decode(&tr.TraceID)
		case "spans":
			return eachElement(dec, func() error {
				var js jaegerSpan
				if err := dec.Decode(&js); err != nil {
					return err
				}
				tr.SpanCount++
				named = named || js.names(want)
				kept.keep(js.span())
				return nil
			})
		case "processes":
			return eachField(dec, func(id string) error {
				var p struct {
					ServiceName string `json:"serviceName"`
				}
				if err := dec.Decode(&p); err != nil {
					return err
				}
				if len(services) < maxProcesses && len(id) <= maxTextBytes {
					services[id] = cut(p.ServiceName)
				}
				return nil
			})
		default:
			return skipValue(dec)
		}
	})
	tr.Spans = kept.resolve(tr.TraceID, services)
	return tr, named, err
}

// jaegerSpan is the part of a span of Jaeger's answer the page needs.
type jaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64       `json:"startTime"`
	Duration  int64       `json:"duration"`
	Tags      []jaegerTag `json:"tags"`
	ProcessID string      `json:"processID"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

func (v jaegerTag) String() string {
	switch x := v.Value.(type) {
	case string:
		return x
	case nil:
		return ""
	default:
		return fmt.Sprint(x)
	}
}

// names reports whether the span carries every one of want's tags: the trace is the
// action's, not only what Jaeger's search matched.
func (s jaegerSpan) names(want map[string]string) bool {
	n := 0
	for _, tag := range s.Tags {
		if v, ok := want[tag.Key]; ok && tag.String() == v {
			n++
		}
	}
	return n == len(want)
}

// span is what the page draws of s, every text cut to maxTextBytes.
func (s jaegerSpan) span() span {
	sp := span{SpanID: cut(s.SpanID), Name: cut(s.OperationName), Start: s.StartTime, Duration: s.Duration, processID: s.ProcessID}
	for _, ref := range s.References {
		if ref.RefType == "CHILD_OF" {
			sp.ParentID, sp.parentTrace = cut(ref.SpanID), ref.TraceID
			break
		}
	}
	for _, tag := range s.Tags {
		switch {
		case tag.Key == "error" && tag.String() == "true", tag.Key == "otel.status_code" && tag.String() == "ERROR":
			sp.Error = true
		case strings.HasPrefix(tag.Key, "flyte."), tag.Key == "otel.status_description", tag.Key == "rpc.method":
			if sp.Attributes == nil {
				sp.Attributes = map[string]string{}
			}
			if len(sp.Attributes) < maxAttributes {
				sp.Attributes[cut(tag.Key)] = cut(tag.String())
			}
		}
	}
	return sp
}

// cut shortens s to at most maxTextBytes, at a character's start, marking the cut. The
// part kept is copied, so that it does not hold the whole of s in memory.
func cut(s string) string { return textbound.Cut(s, maxTextBytes) }

// earliest keeps the maxShownSpans earliest spans it is given, the first the page draws:
// a heap with the latest of them on top, to be dropped for an earlier one.
type earliest []span

func (e earliest) Len() int           { return len(e) }
func (e earliest) Less(i, j int) bool { return e[i].Start > e[j].Start }
func (e earliest) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *earliest) Push(x any)        { *e = append(*e, x.(span)) }
func (e *earliest) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

func (e *earliest) keep(s span) {
	switch {
	case len(*e) < maxShownSpans:
		heap.Push(e, s)
	case s.Start < (*e)[0].Start:
		(*e)[0] = s
		heap.Fix(e, 0)
	}
}

// resolve returns the spans kept, earliest first, with their services, and their
// parents when those are of the same trace.
func (e earliest) resolve(traceID string, services map[string]string) []span {
	out := []span(e)
	for i := range out {
		out[i].Service = services[out[i].processID]
		if out[i].parentTrace != traceID {
			out[i].ParentID = ""
		}
	}
	slices.SortFunc(out, func(a, b span) int { return cmp.Compare(a.Start, b.Start) })
	return out
}

// eachField calls field with each key of the object next in dec; field reads the key's
// value. A null is an object without keys.
func eachField(dec *json.Decoder, field func(key string) error) error {
	if ok, err := open(dec, '{'); !ok {
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if err := field(tok.(string)); err != nil { // the decoder gives keys as strings
			return err
		}
	}
	_, err := dec.Token() // the object's end
	return err
}

// eachElement calls elem for each element of the array next in dec; elem reads it. A
// null is an empty array.
func eachElement(dec *json.Decoder, elem func() error) error {
	if ok, err := open(dec, '['); !ok {
		return err
	}
	for dec.More() {
		if err := elem(); err != nil {
			return err
		}
	}
	_, err := dec.Token() // the array's end
	return err
}

// open reads the start of an object or array, or a null in its place (ok false, no
// error).
func open(dec *json.Decoder, delim json.Delim) (ok bool, err error) {
	tok, err := dec.Token()
	switch {
	case err != nil:
		return false, err
	case tok == nil:
		return false, nil
	case tok != delim:
		return false, fmt.Errorf("found %v where %v begins", tok, delim)
	}
	return true, nil
}

// skipValue reads past the value next in dec a token at a time, keeping none of it.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// cappedReader reads at most left bytes of r, and fails with errTooLarge when asked for
// more: Jaeger's answer is refused past its bound, not cut.
type cappedReader struct {
	r    io.Reader
	left int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}
