package main

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/services/auth/devcreds"
)

func TestRun(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /fail", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	mux.HandleFunc("GET /redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/healthz", http.StatusFound)
	})
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	mux.HandleFunc("POST /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusMethodNotAllowed)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// Over TLS, with a certificate from a private CA as the services have.
	creds, err := devcreds.Ensure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(creds.CertFile, creds.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	tlsSrv := httptest.NewUnstartedServer(mux)
	tlsSrv.EnableHTTP2 = true
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	tlsURL := "https://" + tlsSrv.Listener.Addr().String()

	// A port nothing listens on: listen, note it, close.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + lis.Addr().String() + "/healthz"
	_ = lis.Close()

	other, err := devcreds.Ensure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	otherCA := other.CAFile

	tests := []struct {
		name   string
		args   []string
		want   int
		stderr string
	}{
		{"healthy", []string{srv.URL + "/healthz"}, 0, ""},
		{"not 2xx", []string{srv.URL + "/fail"}, 1, "503"},
		{"unknown path", []string{srv.URL + "/nope"}, 1, "404"},
		{"redirects are not followed", []string{srv.URL + "/redirect"}, 1, "302"},
		{"timeout", []string{"-timeout=100ms", srv.URL + "/slow"}, 1, "deadline exceeded"},
		{"connection refused", []string{closed}, 1, "refused"},
		{"https with its CA", []string{"-cacert=" + creds.CAFile, tlsURL + "/healthz"}, 0, ""},
		{"https with its CA, not 2xx", []string{"-cacert", creds.CAFile, tlsURL + "/fail"}, 1, "503"},
		{"https without its CA", []string{tlsURL + "/healthz"}, 1, "certificate"},
		{"https with another CA", []string{"-cacert=" + otherCA, tlsURL + "/healthz"}, 1, "certificate"},
		{"CA file missing", []string{"-cacert=" + creds.CAFile + ".nope", tlsURL + "/healthz"}, 1, "no such file"},
		{"CA file without a certificate", []string{"-cacert=" + creds.KeyFile, tlsURL + "/healthz"}, 1, "no PEM certificate"},
		{"plain http to a TLS port", []string{"http://" + tlsSrv.Listener.Addr().String() + "/healthz"}, 1, "400"},
		{"no URL", nil, 2, "usage"},
		{"two URLs", []string{srv.URL, srv.URL}, 2, "usage"},
		{"not a URL", []string{"127.0.0.1:8090"}, 2, "not an http(s) URL"},
		{"unknown flag", []string{"-x", srv.URL}, 2, "not defined"},
		{"help", []string{"-help"}, 0, "usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr strings.Builder
			start := time.Now()
			if got := run(tt.args, &stderr); got != tt.want {
				t.Errorf("run(%q) = %d, want %d; stderr: %s", tt.args, got, tt.want, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.stderr)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
}
