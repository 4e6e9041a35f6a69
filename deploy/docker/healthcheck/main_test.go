package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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

	// A port nothing listens on: listen, note it, close.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + lis.Addr().String() + "/healthz"
	_ = lis.Close()

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
