package auth_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/servicetest"
)

// TestTokenFileIsReadAgainWhenItChanges: an operator rotates a token by rewriting the
// file; the running service takes the new token and refuses the old one, and a file
// that no longer parses leaves the last good tokens in place.
func TestTokenFileIsReadAgainWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	write := func(content string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	write("old-token,executor,uid-1,\"flyte:executors\"\n", start)
	a, err := auth.New(auth.Config{Mode: auth.ModeTokenFile, TokenFile: path}, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	status := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	waitFor := func(token string, want int) {
		t.Helper()
		got := 0
		eventually.True(t, 10*time.Second, func() bool { got = status(token); return got == want },
			func() string { return fmt.Sprintf("token %q still answered %d, want %d", token, got, want) })
	}
	if got := status("old-token"); got != http.StatusOK {
		t.Fatalf("the first token: %d", got)
	}

	write("new-token,executor,uid-1,\"flyte:executors\"\n", start.Add(time.Minute))
	waitFor("new-token", http.StatusOK)
	waitFor("old-token", http.StatusUnauthorized)

	write("a line with too few columns\n", start.Add(2*time.Minute))
	time.Sleep(2 * time.Second) // past the recheck interval
	if got := status("new-token"); got != http.StatusOK {
		t.Fatalf("after a broken rewrite the last good token answered %d", got)
	}
}

// TestTokenFileReportsItsLastGoodLoad: a token file that vanishes or stops parsing
// keeps the last good tokens (so a bad edit does not lock the operators out), and says
// so where an alert can see it: the time of the last good load stays put, the last load
// is reported as failed, and each failure is counted and logged once, however long the
// file stays broken.
func TestTokenFileReportsItsLastGoodLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	write := func(content string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	write("good-token,executor,uid-1,\"flyte:executors\"\n", start)
	reg := prometheus.NewRegistry()
	var logs servicetest.SyncBuffer
	a, err := auth.New(auth.Config{Mode: auth.ModeTokenFile, TokenFile: path}, nil, reg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	status := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	const (
		lastSuccess = "flyte_auth_token_file_last_load_success_timestamp_seconds"
		successful  = "flyte_auth_token_file_last_load_successful"
		failures    = "flyte_auth_token_file_load_failures_total"
	)
	firstLoad := metricValue(t, reg, lastSuccess)
	if firstLoad < float64(start.Add(-time.Second).Unix()) {
		t.Errorf("%s = %v at start; want the time of the first load", lastSuccess, firstLoad)
	}

	steps := []struct {
		name     string
		change   func()
		token    string // still accepted
		ok       float64
		failures float64
		logged   int // failure lines logged so far
	}{
		{"a rewrite that does not parse", func() { write("a line with too few columns\n", start.Add(time.Minute)) }, "good-token", 0, 1, 1},
		{"the file removed", func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, "good-token", 0, 2, 2},
		{"a good file again", func() { write("new-token,executor,uid-1,\"flyte:executors\"\n", start.Add(2*time.Minute)) }, "new-token", 1, 2, 2},
	}
	for _, step := range steps {
		step.change()
		// Several recheck intervals, each with a request that looks at the file.
		for deadline := time.Now().Add(3500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			status(step.token)
		}
		if got := status(step.token); got != http.StatusOK {
			t.Errorf("after %s, token %s answered %d", step.name, step.token, got)
		}
		if got := metricValue(t, reg, successful); got != step.ok {
			t.Errorf("after %s, %s = %v; want %v", step.name, successful, got, step.ok)
		}
		if got := metricValue(t, reg, failures); got != step.failures {
			t.Errorf("after %s, %s = %v; want %v", step.name, failures, got, step.failures)
		}
		if got := strings.Count(logs.String(), "level=ERROR"); got != step.logged {
			t.Errorf("after %s, %d failures logged; want %d:\n%s", step.name, got, step.logged, logs.String())
		}
		last := metricValue(t, reg, lastSuccess)
		if reloaded := last > firstLoad; reloaded != (step.ok == 1) {
			t.Errorf("after %s, %s moved from %v to %v", step.name, lastSuccess, firstLoad, last)
		}
	}
}

// metricValue is the value of the gauge or counter name in reg, or -1 when reg has none.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name || len(f.GetMetric()) != 1 {
			continue
		}
		m := f.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	return -1
}
