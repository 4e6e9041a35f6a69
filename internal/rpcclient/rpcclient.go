// Package rpcclient builds the HTTP client that every program of the repository calls
// the events and cache services with: HTTP/2 over TLS (ALPN h2) for https:// URLs and
// HTTP/2 without TLS (h2c) for http:// ones, trusting a CA bundle from a file and sending
// a bearer token from a file, re-read as it is rotated.
package rpcclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"k8s.io/client-go/transport"
)

// Options say how to reach the services.
type Options struct {
	// CAFile is a PEM bundle of the certificate authorities trusted for https:// URLs,
	// instead of the system's. It is read once, by New.
	CAFile string
	// TokenFile holds a bearer token sent with every request, such as a projected
	// ServiceAccount token. It is read by New, again every minute (the kubelet renews
	// such a token well before it expires), and at once after a request is refused as
	// unauthenticated (HTTP 401), so that a rotated token takes over without a restart.
	TokenFile string
	// Timeout bounds each request, reading its response included; 0 means none, for
	// clients that hold streams open.
	Timeout time.Duration
}

// New returns a client for the services.
func New(o Options) (*http.Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pool, err := LoadCAFile(o.CAFile)
		if err != nil {
			return nil, err
		}
		tlsConfig.RootCAs = pool
	}
	// HTTP/2 only: gRPC needs it, and with HTTP/1.1 also allowed an http:// URL would be
	// spoken to in HTTP/1.1 rather than h2c.
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	var rt http.RoundTripper = &http.Transport{
		Protocols:           &protocols,
		TLSClientConfig:     tlsConfig,
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		// A connection whose peer vanished without a word (a restarted pod, a dropped
		// NAT entry) is noticed by a ping instead of hanging the next requests.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
	}
	if o.TokenFile != "" {
		tokens := transport.NewCachedFileTokenSource(o.TokenFile)
		if _, err := tokens.Token(); err != nil {
			return nil, fmt.Errorf("rpcclient: token: %w", err)
		}
		rt = transport.ResettableTokenSourceWrapTransport(tokens)(rt)
	}
	return &http.Client{
		Transport: rt,
		Timeout:   o.Timeout,
		// The token goes with every request the transport sends, so a redirect would
		// carry it wherever it points; the services never redirect.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

// LoadCAFile reads a PEM bundle of certificate authorities, refusing one that holds no
// certificate (a key, or a file cut short, would otherwise trust nothing in silence).
func LoadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rpcclient: CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("rpcclient: CA bundle %s: no PEM certificate in it", path)
	}
	return pool, nil
}
