// Command healthcheck is the container health check of the project's images, which are
// distroless and so have no shell, curl or wget: it GETs the URL it is given and exits 0
// when the answer is 2xx, 1 otherwise (no answer within the timeout, another status, a
// certificate not signed by the CA of -cacert), and 2 on bad usage. Every image carries
// it as /healthcheck, for docker compose:
//
//	healthcheck:
//	  test: ["CMD", "/healthcheck", "-cacert=/credentials/ca.crt", "https://127.0.0.1:8090/healthz"]
//
// It follows no redirects and ignores HTTP_PROXY and friends: a health check asks the
// process in its own container, never something else.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/flytekube/backend/internal/healthcheck"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout, caFile := healthcheck.Flags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: healthcheck [-timeout 2s] [-cacert FILE] http(s)://127.0.0.1:PORT/PATH")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	u, err := url.Parse(fs.Arg(0))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "healthcheck: %q is not an http(s) URL\n", fs.Arg(0))
		return 2
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fmt.Fprintln(stderr, "healthcheck:", err)
			return 1
		}
		tlsConfig.RootCAs = x509.NewCertPool()
		if !tlsConfig.RootCAs.AppendCertsFromPEM(pem) {
			fmt.Fprintf(stderr, "healthcheck: %s holds no PEM certificate\n", *caFile)
			return 1
		}
	}
	if err := check(u.String(), tlsConfig, *timeout); err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	return 0
}

func check(target string, tlsConfig *tls.Config, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, TLSClientConfig: tlsConfig},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New(target + ": " + resp.Status)
	}
	return nil
}
