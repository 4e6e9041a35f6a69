package rpcclient_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flytekube/backend/internal/rpcclient"
)

// seen records what the server saw of each request.
type seen struct {
	mu       sync.Mutex
	protos   []string
	alpn     []string
	bearers  []string
	accepted string // the only token accepted; any when empty
}

func (s *seen) handler(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.protos = append(s.protos, r.Proto)
	if r.TLS != nil {
		s.alpn = append(s.alpn, r.TLS.NegotiatedProtocol)
	}
	s.bearers = append(s.bearers, r.Header.Get("Authorization"))
	if s.accepted != "" && r.Header.Get("Authorization") != "Bearer "+s.accepted {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *seen) last() (proto, alpn, bearer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.protos); n > 0 {
		proto, bearer = s.protos[n-1], s.bearers[n-1]
	}
	if n := len(s.alpn); n > 0 {
		alpn = s.alpn[n-1]
	}
	return proto, alpn, bearer
}

func (s *seen) accept(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accepted = token
}

func tlsServer(t *testing.T) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.handler))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, s
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func pemOf(cert *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))
}

func get(t *testing.T, c *http.Client, url string) (int, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

func TestHTTPSWithCAFileAndToken(t *testing.T) {
	srv, s := tlsServer(t)
	c, err := rpcclient.New(rpcclient.Options{
		CAFile:    writeFile(t, "ca.pem", pemOf(srv.Certificate())),
		TokenFile: writeFile(t, "token", "t1\n"),
		Timeout:   5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Timeout != 5*time.Second {
		t.Errorf("Timeout = %s; want 5s", c.Timeout)
	}
	if code, err := get(t, c, srv.URL+"/x"); err != nil || code != http.StatusNoContent {
		t.Fatalf("GET = %d, %v", code, err)
	}
	if proto, alpn, bearer := s.last(); proto != "HTTP/2.0" || alpn != "h2" || bearer != "Bearer t1" {
		t.Fatalf("the server saw %s, ALPN %q, Authorization %q; want HTTP/2.0, h2, Bearer t1", proto, alpn, bearer)
	}
}

func TestH2CForPlainHTTP(t *testing.T) {
	s := &seen{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.handler))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)

	c, err := rpcclient.New(rpcclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := get(t, c, srv.URL+"/x"); err != nil || code != http.StatusNoContent {
		t.Fatalf("GET = %d, %v", code, err)
	}
	if proto, _, bearer := s.last(); proto != "HTTP/2.0" || bearer != "" {
		t.Fatalf("the server saw %s with Authorization %q; want HTTP/2.0 and none", proto, bearer)
	}
}

// TestRotatedTokenIsUsed: once the token file is rewritten, as the kubelet does with a
// projected token, the client sends the new token; a refusal of the old one (401)
// makes it re-read the file at once rather than at its next periodic read.
func TestRotatedTokenIsUsed(t *testing.T) {
	srv, s := tlsServer(t)
	tokenFile := writeFile(t, "token", "old")
	c, err := rpcclient.New(rpcclient.Options{CAFile: writeFile(t, "ca.pem", pemOf(srv.Certificate())), TokenFile: tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, c, srv.URL); err != nil {
		t.Fatal(err)
	}
	if _, _, bearer := s.last(); bearer != "Bearer old" {
		t.Fatalf("Authorization %q; want Bearer old", bearer)
	}

	// The kubelet swaps a symbolic link; a rename does the same to readers.
	next := tokenFile + ".new"
	if err := os.WriteFile(next, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, tokenFile); err != nil {
		t.Fatal(err)
	}
	s.accept("new")
	var codes []int
	for range 2 {
		code, err := get(t, c, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code)
	}
	if _, _, bearer := s.last(); bearer != "Bearer new" || codes[1] != http.StatusNoContent {
		t.Fatalf("after rotation: statuses %v, last Authorization %q; want the new token accepted", codes, bearer)
	}
}

func TestUntrustedServersAreRefused(t *testing.T) {
	srv, s := tlsServer(t)
	for name, caFile := range map[string]string{
		"system roots": "",
		"another CA":   writeFile(t, "other.pem", pemOf(selfSigned(t))),
		"another too":  writeFile(t, "bundle.pem", pemOf(selfSigned(t))+pemOf(selfSigned(t))),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := rpcclient.New(rpcclient.Options{CAFile: caFile, TokenFile: writeFile(t, "token", "secret")})
			if err != nil {
				t.Fatal(err)
			}
			_, err = get(t, c, srv.URL)
			var unknown x509.UnknownAuthorityError
			if !errors.As(err, &unknown) {
				t.Fatalf("GET of an untrusted server = %v; want an unknown authority", err)
			}
		})
	}
	if _, _, bearer := s.last(); bearer != "" {
		t.Fatalf("an untrusted server received the token: %q", bearer)
	}
}

// TestRedirectsAreNotFollowed: a redirect would carry the token to wherever it points.
func TestRedirectsAreNotFollowed(t *testing.T) {
	target, elsewhere := tlsServer(t)
	redirect := httptest.NewUnstartedServer(http.RedirectHandler(target.URL+"/elsewhere", http.StatusTemporaryRedirect))
	redirect.EnableHTTP2 = true
	redirect.StartTLS()
	t.Cleanup(redirect.Close)
	c, err := rpcclient.New(rpcclient.Options{CAFile: writeFile(t, "ca.pem", pemOf(redirect.Certificate())), TokenFile: writeFile(t, "token", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	code, err := get(t, c, redirect.URL)
	if err != nil || code != http.StatusTemporaryRedirect {
		t.Fatalf("GET = %d, %v; want the redirect itself", code, err)
	}
	if proto, _, _ := elsewhere.last(); proto != "" {
		t.Fatal("the redirect was followed")
	}
}

func TestNewRefusesBadFiles(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent")
	tests := []struct {
		name string
		o    rpcclient.Options
		want string
	}{
		{"missing CA file", rpcclient.Options{CAFile: missing}, missing},
		{"CA file without certificates", rpcclient.Options{CAFile: writeFile(t, "ca.pem", "not a certificate")}, "no PEM certificate"},
		{"missing token file", rpcclient.Options{TokenFile: missing}, missing},
		{"empty token file", rpcclient.Options{TokenFile: writeFile(t, "token", " \n")}, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rpcclient.New(tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

// selfSigned makes a CA certificate that signed nothing the servers here present.
func selfSigned(t *testing.T) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
