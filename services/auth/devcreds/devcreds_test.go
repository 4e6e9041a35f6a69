package devcreds_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"k8s.io/apiserver/pkg/authentication/token/tokenfile"

	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/auth/devcreds"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEnsureMakesWhatTheServicesAndTheExecutorRead: a client trusting ca.crt and sending
// executor.token reaches a TLS server with tls.crt for every default host and the ones
// asked for, and the token file maps each token to its group.
func TestEnsureMakesWhatTheServicesAndTheExecutorRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	c, err := devcreds.Ensure(dir, "events", "cacheservice")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{c.CAFile, c.CertFile, c.KeyFile, c.TokensFile, c.ExecutorTokenFile, c.ViewerTokenFile, c.OperatorTokenFile} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %s, want 0600", f, fi.Mode().Perm())
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, mode %v; want 0700", dir, err, fi.Mode().Perm())
	}

	tokens, err := tokenfile.NewCSV(c.TokensFile)
	if err != nil {
		t.Fatal(err)
	}
	for token, group := range map[string]string{c.ExecutorToken: auth.Executors, c.ViewerToken: auth.Viewers, c.OperatorToken: auth.Operators} {
		resp, ok, err := tokens.AuthenticateToken(context.Background(), token)
		if err != nil || !ok || !slices.Contains(resp.User.GetGroups(), group) {
			t.Errorf("token file: %v %v %+v, want group %s", ok, err, resp, group)
		}
	}
	if c.ExecutorToken == c.ViewerToken || len(c.ExecutorToken) < 32 {
		t.Errorf("tokens %q and %q: want two long, different ones", c.ExecutorToken, c.ViewerToken)
	}

	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var bearers []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		bearers = append(bearers, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	client, err := rpcclient.New(rpcclient.Options{CAFile: c.CAFile, TokenFile: c.ExecutorTokenFile})
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	for _, host := range []string{"127.0.0.1", "localhost"} {
		resp, err := client.Get("https://" + net.JoinHostPort(host, port) + "/")
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		_ = resp.Body.Close()
	}
	mu.Lock()
	if len(bearers) != 2 || bearers[0] != "Bearer "+c.ExecutorToken {
		t.Errorf("the server saw %q", bearers)
	}
	mu.Unlock()

	// The names asked for, checked without DNS.
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots, err := rpcclient.LoadCAFile(c.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"events", "cacheservice", "::1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
			t.Errorf("the serving certificate does not serve %s: %v", host, err)
		}
	}
}

// TestEnsureKeepsWhatIsGood: a second run writes nothing; a new host reissues only the
// serving certificate; a lost CA key replaces the CA and the certificate but keeps the
// tokens.
func TestEnsureKeepsWhatIsGood(t *testing.T) {
	dir := t.TempDir()
	first, err := devcreds.Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Generated) != 8 {
		t.Errorf("the first run wrote %q, want all eight files", first.Generated)
	}
	ca, cert := read(t, first.CAFile), read(t, first.CertFile)

	again, err := devcreds.Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Generated) != 0 || again.ExecutorToken != first.ExecutorToken || again.ViewerToken != first.ViewerToken {
		t.Errorf("a second run wrote %q and changed tokens: %v", again.Generated, again.ExecutorToken != first.ExecutorToken)
	}

	more, err := devcreds.Ensure(dir, "events")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(more.Generated, []string{devcreds.KeyFile, devcreds.CertFile}) || !bytes.Equal(read(t, more.CAFile), ca) {
		t.Errorf("a new host wrote %q; want only the serving certificate, under the same CA", more.Generated)
	}
	if bytes.Equal(read(t, more.CertFile), cert) {
		t.Error("the serving certificate was not reissued for the new host")
	}

	if err := os.Remove(filepath.Join(dir, devcreds.CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	renewed, err := devcreds.Ensure(dir, "events")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(read(t, renewed.CAFile), ca) || !slices.Contains(renewed.Generated, devcreds.CertFile) {
		t.Errorf("without its key the CA was kept, or the certificate not reissued: wrote %q", renewed.Generated)
	}
	if renewed.ExecutorToken != first.ExecutorToken {
		t.Error("the tokens changed with the CA")
	}
}

// TestEnsureConcurrently: callers starting together end with one consistent set.
func TestEnsureConcurrently(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	results := make([]*devcreds.Credentials, 4)
	for i := range results {
		wg.Go(func() {
			c, err := devcreds.Ensure(dir, "events")
			if err != nil {
				t.Error(err)
			}
			results[i] = c
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, c := range results[1:] {
		if c.ExecutorToken != results[0].ExecutorToken {
			t.Error("concurrent callers made different tokens")
		}
	}
	pair, err := tls.LoadX509KeyPair(results[0].CertFile, results[0].KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots, err := rpcclient.LoadCAFile(results[0].CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "events"}); err != nil {
		t.Errorf("the certificate is not the CA's: %v", err)
	}
}
