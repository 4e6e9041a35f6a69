package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/servicetest"
)

// servedCertificate opens a new connection and returns the host names of the certificate
// the server presented and the HTTP version spoken.
func servedCertificate(t *testing.T, pki *servicetest.PKI, url string) ([]string, int) {
	t.Helper()
	client := pki.Client("")
	defer client.CloseIdleConnections()
	resp, err := client.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	return resp.TLS.PeerCertificates[0].DNSNames, resp.ProtoMajor
}

// TestTLSCertificateRotatesWithoutRestart: a certificate written over the files, as
// cert-manager rotates it, is served to new connections by the running server, over
// HTTP/2 negotiated by ALPN; cleartext is refused.
func TestTLSCertificateRotatesWithoutRestart(t *testing.T) {
	pki := servicetest.NewPKI(t)
	url := strings.Replace(startWith(t, pki.ServerConfig(), &testService{}), "http://", "https://", 1)

	names, proto := servedCertificate(t, pki, url)
	if slices.Contains(names, "rotated.example") || proto != 2 {
		t.Fatalf("served %v over HTTP/%d, want the first certificate over HTTP/2", names, proto)
	}
	client := eventsv1connect.NewEventsServiceClient(pki.Client(""), url, connect.WithGRPC())
	if _, err := client.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{Id: validID()})); err != nil {
		t.Fatalf("gRPC over TLS: %v", err)
	}
	if _, err := servicetest.H2CClient().Get(strings.Replace(url, "https://", "http://", 1) + "/healthz"); err == nil {
		t.Error("the TLS port answered cleartext HTTP/2")
	}
	if _, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}}).Get(url + "/healthz"); err == nil {
		t.Error("a client that does not trust the CA was answered")
	}

	pki.Reissue(t, "rotated.example")
	eventually.True(t, 30*time.Second, func() bool {
		names, _ := servedCertificate(t, pki, url)
		return slices.Contains(names, "rotated.example")
	}, func() string { return "the server still presents the old certificate after the files changed" })
}

// TestCertificateExpiryIsExported: the served certificate's end is a metric, read at
// each scrape, so a rotated certificate's end shows without a restart.
func TestCertificateExpiryIsExported(t *testing.T) {
	pki := servicetest.NewPKI(t)
	cfg := pki.ServerConfig()
	cfg.Addr = "127.0.0.1:0"
	srv, err := server.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := srv.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	expiry := func() float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == server.CertificateExpiryMetric {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("%s not gathered", server.CertificateExpiryMetric)
		return 0
	}
	raw, err := os.ReadFile(pki.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(raw)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got := expiry(); got != float64(cert.NotAfter.Unix()) {
		t.Fatalf("%s = %v; want the certificate's NotAfter %d", server.CertificateExpiryMetric, got, cert.NotAfter.Unix())
	}

	// Without TLS there is nothing to expire.
	plain, err := server.New(server.Config{Addr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	empty := prometheus.NewRegistry()
	if err := plain.RegisterMetrics(empty); err != nil {
		t.Fatal(err)
	}
	if families, _ := empty.Gather(); len(families) != 0 {
		t.Fatalf("gathered %d families without TLS; want none", len(families))
	}
}
