// Package devcreds makes the credentials the events and cache services run with on a
// laptop (`make run`, docker compose): a private certificate authority, a serving
// certificate it signed, and static bearer tokens for an executor, a viewer and an operator of the CloudEvents egress in the
// services' token-file format. Ensure keeps what a directory already holds while it is
// still good, so that a CA a user trusted or a token they copied stays valid between runs.
package devcreds

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/csv"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flytekube/backend/services/auth"
)

// The files of a credentials directory.
const (
	CAFile            = "ca.crt"         // the CA's certificate: what clients trust
	CAKeyFile         = "ca.key"         // the CA's key, kept to issue a new serving certificate
	CertFile          = "tls.crt"        // the services' serving certificate
	KeyFile           = "tls.key"        // its key
	TokensFile        = "tokens.csv"     // --auth-token-file of both services
	ExecutorTokenFile = "executor.token" // the executor's serviceTokenFile
	ViewerTokenFile   = "viewer.token"   // a read-only caller's token, for buf curl
	OperatorTokenFile = "operator.token" // the CloudEvents egress's operator, for buf curl
)

// Lifetimes: the serving certificate is renewed by the run that finds it within renewBefore
// of its end; the CA lasts long enough that a user trusts it once.
const (
	caLifetime   = 5 * 365 * 24 * time.Hour
	certLifetime = 90 * 24 * time.Hour
	renewBefore  = 30 * 24 * time.Hour
)

// DefaultHosts are the names every serving certificate covers: the loopback.
var DefaultHosts = []string{"localhost", "127.0.0.1", "::1"}

// Credentials are the files of a credentials directory, as absolute paths, and the tokens.
type Credentials struct {
	Dir                                            string
	CAFile, CertFile, KeyFile                      string
	TokensFile, ExecutorTokenFile, ViewerTokenFile string
	OperatorTokenFile                              string
	ExecutorToken, ViewerToken, OperatorToken      string
	Generated                                      []string // the files this call wrote, by name
}

// Ensure makes dir hold a complete set of credentials whose serving certificate covers
// DefaultHosts and hosts (DNS names or IP addresses), writing only what is missing or no
// longer good: a CA that is missing, unreadable or about to expire is replaced (and so is
// everything it signed); a serving certificate that lacks a host, was not signed by the
// CA or is within 30 days of its end is reissued; tokens are kept once made. Files are
// written with mode 0600 by rename, and a lock on the directory lets two callers start
// together.
func Ensure(dir string, hosts ...string) (*Credentials, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("devcreds: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devcreds: %w", err)
	}
	unlock, err := lock(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	c := &Credentials{
		Dir:    dir,
		CAFile: filepath.Join(dir, CAFile), CertFile: filepath.Join(dir, CertFile), KeyFile: filepath.Join(dir, KeyFile),
		TokensFile: filepath.Join(dir, TokensFile), ExecutorTokenFile: filepath.Join(dir, ExecutorTokenFile),
		ViewerTokenFile: filepath.Join(dir, ViewerTokenFile), OperatorTokenFile: filepath.Join(dir, OperatorTokenFile),
	}
	write := func(name string, data []byte) error {
		if err := writeFile(filepath.Join(dir, name), data); err != nil {
			return err
		}
		c.Generated = append(c.Generated, name)
		return nil
	}
	// writePair writes a key and its certificate, the key first: a certificate without
	// its key would be thrown away next time, and the services re-read both when the
	// certificate changes.
	writePair := func(keyName, certName string, key *ecdsa.PrivateKey, der []byte) error {
		keyPEM, err := keyToPEM(key)
		if err != nil {
			return err
		}
		if err := write(keyName, keyPEM); err != nil {
			return err
		}
		return write(certName, certToPEM(der))
	}
	now := time.Now()

	ca, caKey, err := loadPair(c.CAFile, filepath.Join(dir, CAKeyFile))
	if err != nil || !ca.IsCA || now.Add(certLifetime).After(ca.NotAfter) {
		if ca, caKey, err = newCA(now); err != nil {
			return nil, err
		}
		if err := writePair(CAKeyFile, CAFile, caKey, ca.Raw); err != nil {
			return nil, err
		}
	}

	want := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(DefaultHosts), hosts...))))
	if cert, _, err := loadPair(c.CertFile, c.KeyFile); err != nil || !servesFor(cert, ca, want, now.Add(renewBefore)) {
		der, key, err := issue(ca, caKey, want, now)
		if err != nil {
			return nil, err
		}
		if err := writePair(KeyFile, CertFile, key, der); err != nil {
			return nil, err
		}
	}

	for _, t := range []struct {
		file  string
		token *string
	}{{ExecutorTokenFile, &c.ExecutorToken}, {ViewerTokenFile, &c.ViewerToken}, {OperatorTokenFile, &c.OperatorToken}} {
		raw, err := os.ReadFile(filepath.Join(dir, t.file))
		if *t.token = strings.TrimSpace(string(raw)); err == nil && *t.token != "" {
			continue
		}
		if *t.token, err = newToken(); err != nil {
			return nil, err
		}
		if err := write(t.file, []byte(*t.token+"\n")); err != nil {
			return nil, err
		}
	}
	tokens, err := tokenFile(c.ExecutorToken, c.ViewerToken, c.OperatorToken)
	if err != nil {
		return nil, err
	}
	if old, err := os.ReadFile(c.TokensFile); err != nil || !bytes.Equal(old, tokens) {
		if err := write(TokensFile, tokens); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// tokenFile is the services' --auth-token-file: kube-apiserver's static token CSV.
func tokenFile(executor, viewer, operator string) ([]byte, error) {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	if err := w.WriteAll([][]string{
		{executor, "executor", "dev-executor", auth.Executors},
		{viewer, "viewer", "dev-viewer", auth.Viewers},
		{operator, "operator", "dev-operator", auth.Operators},
	}); err != nil {
		return nil, fmt.Errorf("devcreds: token file: %w", err)
	}
	return b.Bytes(), nil
}

func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, tmpl, err := newKey("CA", "flyte-backend development CA", now, caLifetime)
	if err != nil {
		return nil, nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.MaxPathLenZero = true, true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("devcreds: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("devcreds: CA certificate: %w", err)
	}
	return ca, key, nil
}

func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, now time.Time) ([]byte, *ecdsa.PrivateKey, error) {
	key, tmpl, err := newKey("serving", "flyte-backend services", now, certLifetime)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("devcreds: serving certificate: %w", err)
	}
	return der, key, nil
}

// servesFor says whether cert chains to ca, covers every host and is valid until after.
func servesFor(cert, ca *x509.Certificate, hosts []string, after time.Time) bool {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, h := range hosts {
		opts := x509.VerifyOptions{Roots: roots, DNSName: h, CurrentTime: time.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		if _, err := cert.Verify(opts); err != nil {
			return false
		}
	}
	return after.Before(cert.NotAfter)
}

// loadPair reads a certificate and its private key, which must match.
func loadPair(certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cert, err := readCert(certFile)
	if err != nil {
		return nil, nil, err
	}
	raw, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return nil, nil, fmt.Errorf("%s: no PEM block", keyFile)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, fmt.Errorf("%s is not the key of %s", keyFile, certFile)
	}
	return cert, key, nil
}

func readCert(file string) (*x509.Certificate, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return x509.ParseCertificate(block.Bytes)
}

func certToPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func keyToPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("devcreds: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// newKey makes a key, and the template of a certificate of it named commonName, valid
// from an hour before now (for clocks a little behind) for lifetime; what names the key
// in errors.
func newKey(what, commonName string, now time.Time, lifetime time.Duration) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("devcreds: %s key: %w", what, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("devcreds: serial number: %w", err)
	}
	return key, &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"flyte-backend development"}, CommonName: commonName},
		NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(lifetime),
	}, nil
}

// newToken is 32 random bytes in hex: a static token is only as strong as it is long.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("devcreds: token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// writeFile replaces path whole, so a reader never sees half a file.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("devcreds: %w", err)
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o600)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("devcreds: writing %s: %w", path, err)
	}
	return nil
}

// lock takes an exclusive lock on dir/.lock until the returned function is called.
func lock(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("devcreds: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("devcreds: locking %s: %w", f.Name(), err)
	}
	return func() { _ = f.Close() }, nil
}
