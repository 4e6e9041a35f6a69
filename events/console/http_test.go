package console_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/console"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/servicetest"
)

// TestAbsoluteFormTargetsAreHostChecked: a request line naming an authority
// ("GET http://host/... HTTP/1.1") is routed by that authority, not by the Host header,
// and the loopback check must judge the one routed by.
func TestAbsoluteFormTargetsAreHostChecked(t *testing.T) {
	s := startService(t)
	addr := strings.TrimPrefix(strings.TrimSuffix(s.console, "/console/"), "http://")
	for _, c := range []struct {
		name, target, host string
		status             int
	}{
		{"an outside authority, a loopback Host", "http://attacker.example/console/", addr, http.StatusMisdirectedRequest},
		{"a loopback authority, an outside Host", "http://" + addr + "/console/", "attacker.example", http.StatusOK},
		{"origin form, an outside Host", "/console/", "attacker.example", http.StatusMisdirectedRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", c.target, c.host); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Errorf("status %d, want %d", resp.StatusCode, c.status)
			}
		})
	}
}

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

// The script and page go compressed to a browser that takes gzip, each encoding with
// its own ETag, and both revalidate to 304.
func TestAssetsAreSentCompressedToWhoAcceptsIt(t *testing.T) {
	s := startService(t)
	script := s.console + "console.js"
	get := func(acceptEncoding, ifNoneMatch string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest("GET", script, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Set by hand, the transport hands the body over as it came.
		req.Header.Set("Accept-Encoding", acceptEncoding)
		if ifNoneMatch != "" {
			req.Header.Set("If-None-Match", ifNoneMatch)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	plain, plainBody := get("identity", "")
	zipped, zippedBody := get("gzip, deflate, br", "")
	if plain.Header.Get("Content-Encoding") != "" || zipped.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding %q without gzip, %q with it", plain.Header.Get("Content-Encoding"), zipped.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(bytes.NewReader(zippedBody))
	if err != nil {
		t.Fatal(err)
	}
	unzipped, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(unzipped, plainBody) {
		t.Fatalf("the compressed script is not the script (%d bytes unzipped, %d plain)", len(unzipped), len(plainBody))
	}
	if 2*len(zippedBody) > len(plainBody) {
		t.Errorf("compressed to %d of %d bytes: less than half saved", len(zippedBody), len(plainBody))
	}
	for _, resp := range []*http.Response{plain, zipped} {
		if resp.Header.Get("Vary") != "Accept-Encoding" {
			t.Errorf("Vary %q, want Accept-Encoding", resp.Header.Get("Vary"))
		}
	}
	if plain.Header.Get("ETag") == zipped.Header.Get("ETag") {
		t.Errorf("both encodings have ETag %s", plain.Header.Get("ETag"))
	}
	if resp, _ := get("gzip", zipped.Header.Get("ETag")); resp.StatusCode != http.StatusNotModified {
		t.Errorf("revalidating the compressed script: %s", resp.Status)
	}
	if resp, _ := get("identity", plain.Header.Get("ETag")); resp.StatusCode != http.StatusNotModified {
		t.Errorf("revalidating the plain script: %s", resp.Status)
	}
	if resp, _ := get("identity", zipped.Header.Get("ETag")); resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" {
		t.Errorf("the compressed script's ETag, without gzip: %s, Content-Encoding %q", resp.Status, resp.Header.Get("Content-Encoding"))
	}
}

// With the service's certificate the console speaks TLS (HTTP/2), anywhere: the
// certificate, not the Host header, keeps other sites out.
func TestConsoleSpeaksTLSWithTheServiceCertificate(t *testing.T) {
	pki := servicetest.NewPKI(t)
	s := startService(t, func(c *events.Config) {
		drain := c.Server.StreamDrainDelay
		c.Server = pki.ServerConfig()
		c.Server.StreamDrainDelay = drain
	})
	page := "https://" + strings.TrimPrefix(s.console, "http://")
	req, err := http.NewRequest("GET", page, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "events:8092" // as compose's other containers name it
	resp, err := pki.Client("").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Errorf("over TLS: %s %s, want 200 over HTTP/2", resp.Proto, resp.Status)
	}
	api := page + "api/flyte.events.v1.EventsService/ListActions"
	listed, err := pki.Client(s.tokens.Viewer).Post(api, "application/json", strings.NewReader(`{"project":"demo","domain":"development"}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = listed.Body.Close()
	if listed.StatusCode != http.StatusOK {
		t.Errorf("a read RPC over TLS: %s", listed.Status)
	}
	cleartext, err := http.Get(s.console)
	if err != nil {
		t.Fatal(err)
	}
	_ = cleartext.Body.Close()
	if cleartext.StatusCode != http.StatusBadRequest {
		t.Errorf("cleartext to the TLS console: %s, want 400", cleartext.Status)
	}
}

// Plain HTTP only on the loopback; TLS anywhere.
func TestConsoleAddressIsCheckedAgainstItsProtocol(t *testing.T) {
	tlsFiles := server.Config{TLSCertFile: "tls.crt", TLSKeyFile: "tls.key"}
	for _, c := range []struct {
		name      string
		listen    string
		server    server.Config
		plaintext bool
		ok        bool
	}{
		{"plain on the loopback", "127.0.0.1:8092", server.Config{}, false, true},
		{"plain on localhost", "localhost:8092", server.Config{}, false, true},
		{"plain on every address", ":8092", server.Config{}, false, false},
		{"plain on another address", "10.0.0.1:8092", server.Config{}, false, false},
		{"TLS on every address", ":8092", tlsFiles, false, true},
		{"asked for plain despite a certificate, on every address", ":8092", tlsFiles, true, false},
		{"asked for plain despite a certificate, on the loopback", "127.0.0.1:8092", tlsFiles, true, true},
		{"no port", "127.0.0.1", server.Config{}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := events.Config{
				DatabaseURL: "postgres://x", ConsoleListen: c.listen, ConsolePlaintext: c.plaintext, Server: c.server,
				Auth: auth.Config{Mode: auth.ModeNone},
			}.WithDefaults()
			err := cfg.Validate()
			if (err == nil) != c.ok {
				t.Errorf("Validate: %v, want ok %v", err, c.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "console-listen") {
				t.Errorf("the error does not name the flag: %v", err)
			}
		})
	}
}

// TestConsoleConnectionsBeyondTheLimitWait: the console's listener serves at most
// console.MaxConnections connections at once, so a flood of them cannot each hold its
// buffers and flow-control windows in the events process; the next waits for one to go.
func TestConsoleConnectionsBeyondTheLimitWait(t *testing.T) {
	s := startService(t)
	addr := strings.TrimPrefix(strings.TrimSuffix(s.console, "/console/"), "http://")
	request := func(conn net.Conn) {
		t.Helper()
		if _, err := fmt.Fprintf(conn, "GET /console/ HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
			t.Fatal(err)
		}
	}
	var served []net.Conn
	for range console.MaxConnections {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		request(conn)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("a connection within the limit: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		served = append(served, conn) // kept alive, so still counted
	}
	next, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close() })
	request(next)
	answer := bufio.NewReader(next)
	_ = next.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := answer.ReadByte(); err == nil {
		t.Fatalf("connection %d was served while %d were open", console.MaxConnections+1, console.MaxConnections)
	}
	_ = served[0].Close()
	_ = next.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := http.ReadResponse(answer, nil); err != nil {
		t.Fatalf("the waiting connection after one closed: %v", err)
	}
}
