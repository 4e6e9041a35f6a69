package console_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/console"
)

// What the console's listener answers, read without a browser.
func TestConsoleListenerAnswers(t *testing.T) {
	s := startService(t)
	sample(t, s, time.Now().Add(-time.Minute).Truncate(time.Second))
	base := strings.TrimSuffix(s.console, "/console/")
	read := `{"project":"demo","domain":"development"}`
	for _, c := range []struct {
		name, method, path, host, token, body string
		status                                int
		header                                map[string]string
	}{
		{name: "the page", method: "GET", path: "/console/", status: 200, header: map[string]string{
			"Content-Security-Policy": console.ContentSecurityPolicy, "Content-Type": "text/html; charset=utf-8",
			"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
		}},
		{name: "a deep link", method: "GET", path: "/console/?project=demo&domain=development&run=r", status: 200},
		{name: "the script", method: "GET", path: "/console/console.js", status: 200, header: map[string]string{"Content-Type": "text/javascript; charset=utf-8"}},
		{name: "the root", method: "GET", path: "/", status: http.StatusFound},
		{name: "another file", method: "GET", path: "/console/secret.txt", status: 404},
		{name: "a read RPC with a viewer's token", method: "POST", path: "/console/api/flyte.events.v1.EventsService/ListActions",
			token: s.tokens.Viewer, body: read, status: 200, header: map[string]string{"Cache-Control": "no-store"}},
		{name: "a read RPC without a token", method: "POST", path: "/console/api/flyte.events.v1.EventsService/ListActions",
			body: read, status: 401},
		{name: "Record, even with the executor's token", method: "POST", path: "/console/api/flyte.events.v1.EventsService/Record",
			token: s.tokens.Executor, body: `{"events":[]}`, status: 404},
		{name: "reflection", method: "POST", path: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", token: s.tokens.Viewer, status: 404},
		{name: "a host name that is not the loopback's", method: "GET", path: "/console/", host: "attacker.example:80", status: http.StatusMisdirectedRequest},
		{name: "localhost", method: "GET", path: "/console/", host: "localhost:1234", status: 200},
		{name: "traces without Jaeger", method: "GET", path: "/console/api/traces?project=demo&domain=development&run=nightly-etl&action=load",
			token: s.tokens.Viewer, status: 404},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if c.host != "" {
				req.Host = c.host
			}
			if c.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			for k, v := range c.header {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}

// The trace lookup answers only what the caller's token may read.
func TestTraceLookupIsAuthorizedAsReadingTheAction(t *testing.T) {
	// Jaeger is never reached here: every call is refused before.
	s := startService(t, func(c *events.Config) { c.JaegerQueryURL = "http://127.0.0.1:9" })
	sample(t, s, time.Now().Add(-time.Minute).Truncate(time.Second))
	lookup := s.console + "api/traces?project=demo&domain=development&run=nightly-etl&action=load"
	for _, c := range []struct {
		name, url, token string
		status           int
		code             string
	}{
		{"no token", lookup, "", 401, "unauthenticated"},
		{"a bad token", lookup, "nope", 401, "unauthenticated"},
		{"a token that may not read the project", lookup, s.tokens.Other, 403, "permission_denied"},
		{"an action that does not exist", strings.Replace(lookup, "action=load", "action=nope", 1), s.tokens.Viewer, 404, "not_found"},
		{"an invalid name", strings.Replace(lookup, "run=nightly-etl", "run=Bad%20Name", 1), s.tokens.Viewer, 400, "invalid_argument"},
		{"Jaeger down", lookup, s.tokens.Viewer, 503, "unavailable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", c.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			var body struct{ Code, Message string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.status || body.Code != c.code {
				t.Errorf("got %d %s (%s), want %d %s", resp.StatusCode, body.Code, body.Message, c.status, c.code)
			}
		})
	}
}
