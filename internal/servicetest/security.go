package servicetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/transport"

	"github.com/flytekube/backend/services/auth"
)

// PKI is a throwaway certificate authority and a serving certificate it signed for
// 127.0.0.1 and localhost, as PEM files in a test's temporary directory.
type PKI struct {
	CAFile, CertFile, KeyFile string

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	pool  *x509.CertPool
}

// NewPKI writes a new CA and a serving certificate.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{
		CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		ca: ca, caKey: caKey, pool: x509.NewCertPool(),
	}
	p.pool.AddCert(ca)
	writePEM(t, p.CAFile, "CERTIFICATE", der)
	p.Issue(t, "server")
	return p
}

// Issue writes a new serving certificate with the given common name over CertFile and
// KeyFile, as a certificate manager rotating it would.
func (p *PKI) Issue(t testing.TB, commonName string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// The key first: a watcher that sees the certificate change reads both.
	writePEM(t, p.KeyFile, "PRIVATE KEY", keyDER)
	writePEM(t, p.CertFile, "CERTIFICATE", der)
}

// Client is an HTTP/2 client over TLS that trusts the CA, sending token when not empty.
func (p *PKI) Client(token string) *http.Client {
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	var rt http.RoundTripper = &http.Transport{Protocols: &protocols, TLSClientConfig: &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}}
	if token != "" {
		rt = transport.NewBearerAuthRoundTripper(token, rt)
	}
	return &http.Client{Transport: rt}
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
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
