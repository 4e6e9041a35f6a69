package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/flytekube/backend/test/ports"
)

// The links the fault proxy stands on: what the executors reach the API server, the
// events service and the cache service through, and what the services reach Postgres
// through. The soak's own clients (its watches, the stand-in kubelet, the checks) go
// straight to each, so that a fault on a link is the system's alone to live through.
const (
	linkPostgres  = "postgres"
	linkAPIServer = "apiserver"
	linkEvents    = "events" // one proxy a replica: events-0 and events-1
	linkCache     = "cache"
)

var links = []string{linkPostgres, linkAPIServer, linkEvents, linkCache}

// faultProxy is toxiproxy run in the soak's process, each proxy listening on 127.0.0.1
// at a port of its own and forwarding to one program.
type faultProxy struct {
	server  *toxiproxy.ApiServer
	proxies map[string][]*toxiproxy.Proxy // by link; events has one a replica
}

func newFaultProxy() *faultProxy {
	// The toxics log through zerolog's global logger, at trace level.
	zerolog.SetGlobalLevel(zerolog.WarnLevel)
	return &faultProxy{
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		proxies: map[string][]*toxiproxy.Proxy{},
	}
}

// add starts a proxy of link in front of upstream (host:port) and returns the address
// it listens on.
func (fp *faultProxy) add(link, upstream string) (string, error) {
	p, err := ports.Free(1)
	if err != nil {
		return "", err
	}
	name := link + "-" + strconv.Itoa(len(fp.proxies[link]))
	listen := "127.0.0.1:" + strconv.Itoa(p[0])
	proxy := toxiproxy.NewProxy(fp.server, name, listen, upstream)
	if err := fp.server.Collection.Add(proxy, true); err != nil {
		return "", fmt.Errorf("fault proxy %s: %w", name, err)
	}
	fp.proxies[link] = append(fp.proxies[link], proxy)
	return listen, nil
}

// toxic is one toxic to put on a link, both ways.
type toxic struct {
	kind       string // toxiproxy's type: latency, bandwidth, timeout
	attributes string // its JSON attributes
}

// poison puts t on every proxy of link, in both directions.
func (fp *faultProxy) poison(link string, t toxic) error {
	for _, p := range fp.proxies[link] {
		for _, dir := range []string{"upstream", "downstream"} {
			body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, t.kind+"-"+dir, t.kind, dir, t.attributes)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
				return fmt.Errorf("fault proxy %s: adding %s: %w", p.Name, t.kind, err)
			}
		}
	}
	return nil
}

// heal takes every toxic off link's proxies. After a half-open spell it also resets the
// connections that lived through it, as a firewall's or a load balancer's idle timeout
// would: the timeout toxic dropped what they carried, and TCP never resumes a stream
// with bytes missing.
func (fp *faultProxy) heal(ctx context.Context, link string, reset bool) error {
	for _, p := range fp.proxies[link] {
		p.Toxics.ResetToxics(ctx)
		if reset {
			p.Stop()
			if err := p.Start(); err != nil {
				return fmt.Errorf("fault proxy %s: starting again: %w", p.Name, err)
			}
		}
	}
	return nil
}

// cut stops link's proxies (nothing listens: connections are refused, those open are
// closed), and mend starts them again on the same addresses.
func (fp *faultProxy) cut(link string) {
	for _, p := range fp.proxies[link] {
		p.Stop()
	}
}

func (fp *faultProxy) mend(link string) error {
	for _, p := range fp.proxies[link] {
		if err := p.Start(); err != nil {
			return fmt.Errorf("fault proxy %s: starting again: %w", p.Name, err)
		}
	}
	return nil
}

// stop ends every proxy.
func (fp *faultProxy) stop() {
	_ = fp.server.Collection.Clear()
}
