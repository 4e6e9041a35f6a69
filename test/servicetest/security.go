package servicetest

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/transport"

	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/services/server"
)

// PKI is a throwaway certificate authority and a serving certificate it signed for the
// loopback, as PEM files in a test's temporary directory: the credentials `make run`
// makes (services/auth/devcreds), so tests and the sandbox trust the same way.
type PKI struct {
	CAFile, CertFile, KeyFile string

	dir string
}

// NewPKI writes a new CA and a serving certificate.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	creds, err := devcreds.Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rpcclient.LoadCAFile(creds.CAFile); err != nil {
		t.Fatal(err)
	}
	return &PKI{CAFile: creds.CAFile, CertFile: creds.CertFile, KeyFile: creds.KeyFile, dir: dir}
}

// ServerConfig is a server's configuration serving TLS with the PKI's certificate.
func (p *PKI) ServerConfig() server.Config {
	return server.Config{TLSCertFile: p.CertFile, TLSKeyFile: p.KeyFile}
}

// Reissue writes a new serving certificate that also covers host over CertFile and
// KeyFile, as a certificate manager rotating it would.
func (p *PKI) Reissue(t testing.TB, host string) {
	t.Helper()
	if _, err := devcreds.Ensure(p.dir, host); err != nil {
		t.Fatal(err)
	}
}

// Client is the programs' HTTP/2 client (internal/rpcclient) trusting the CA, sending
// token when not empty.
func (p *PKI) Client(token string) *http.Client {
	c, err := rpcclient.New(rpcclient.Options{CAFile: p.CAFile})
	if err != nil {
		panic(err) // NewPKI read the same file
	}
	if token != "" {
		c.Transport = transport.NewBearerAuthRoundTripper(token, c.Transport)
	}
	return c
}

// Tokens are static tokens for each kind of caller, in a file in kube-apiserver's token
// format, for auth mode token-file.
type Tokens struct {
	File                    string
	Executor, Viewer, Other string
}

// NewTokens writes a token file with an executor, a viewer and an identity in neither
// group.
func NewTokens(t testing.TB) Tokens {
	t.Helper()
	tok := Tokens{File: filepath.Join(t.TempDir(), "tokens.csv"), Executor: randomToken(t), Viewer: randomToken(t), Other: randomToken(t)}
	content := fmt.Sprintf("%s,executor,uid-1,%q\n%s,viewer,uid-2,%q\n%s,other,uid-3,\"someone:else\"\n",
		tok.Executor, auth.Executors, tok.Viewer, auth.Viewers, tok.Other)
	if err := os.WriteFile(tok.File, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return tok
}

// AuthConfig authenticates callers with the token file (auth mode token-file).
func (tok Tokens) AuthConfig() auth.Config {
	return auth.Config{Mode: auth.ModeTokenFile, TokenFile: tok.File}
}

func randomToken(t testing.TB) string {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// WithToken returns an h2c client sending token.
func WithToken(token string) *http.Client {
	c := H2CClient()
	c.Transport = transport.NewBearerAuthRoundTripper(token, c.Transport)
	return c
}
