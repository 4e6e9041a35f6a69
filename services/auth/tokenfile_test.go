package auth_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/internal/eventually"
	"github.com/flytekube/backend/services/auth"
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
