package upgrade

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

// sink is an HTTP receiver of CloudEvents: it counts every event it acknowledges by id
// (the event's identity, docs/events.md), in binary, structured or batched mode.
type sink struct {
	srv *httptest.Server

	mu       sync.Mutex
	got      map[string]int // id -> times acknowledged
	requests int
}

func newSink() *sink {
	s := &sink{got: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.receive))
	return s
}

// sinkName is the sink's name in every release's configuration: its cursor's key, kept
// across the rollout.
const sinkName = "upgrade-sink"

// flagURL is the sink as a --cloudevents-sink URL, the form of releases without
// --cloudevents-config: the test's project alone (the preloaded store's events are not
// the sink's).
func (s *sink) flagURL() string {
	return s.srv.URL + "/events?name=" + sinkName + "&project=" + project
}

// configFile writes the sink as a --cloudevents-config file, the tree's form (its
// --cloudevents-sink takes no filter), and returns its path.
func (s *sink) configFile(dir string) (string, error) {
	path := filepath.Join(dir, "cloudevents-sinks.yaml")
	raw := fmt.Sprintf("sinks:\n  - name: %s\n    http: {url: %q}\n    filter: {projects: [%s]}\n", sinkName, s.srv.URL+"/events", project)
	if err := os.WriteFile(path, []byte(raw), 0o644); err != nil {
		return "", fmt.Errorf("sink: %w", err)
	}
	return path, nil
}

func (s *sink) receive(w http.ResponseWriter, r *http.Request) {
	var events []event.Event
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/cloudevents-batch+json") {
		evs, err := cehttp.NewEventsFromHTTPRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		events = evs
	} else {
		e, err := cehttp.NewEventFromHTTPRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		events = []event.Event{*e}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	for _, e := range events {
		s.got[e.ID()]++
	}
}

// times is how often the event with this id was acknowledged.
func (s *sink) times(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[id]
}

// counts says how many distinct events and requests the sink took.
func (s *sink) counts() (events, requests int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got), s.requests
}

func (s *sink) close() { s.srv.Close() }
