package upgrade

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// balancer stands in for a Kubernetes Service in front of a service's replicas: it
// spreads connections over the replicas in rotation, one connection at a time, as
// kube-proxy does. A replica taken out of rotation keeps its open connections until it
// exits, as a terminating pod's do; a client then finds another on its next connection.
type balancer struct {
	ln net.Listener

	mu       sync.Mutex
	backends []string // host:port of each replica in rotation
	next     int
}

func newBalancer() (*balancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("balancer: %w", err)
	}
	b := &balancer{ln: ln}
	go b.serve()
	return b, nil
}

// addr is the service's address (host:port).
func (b *balancer) addr() string { return b.ln.Addr().String() }

// set puts exactly these replicas in rotation.
func (b *balancer) set(backends ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends = append([]string(nil), backends...)
}

func (b *balancer) close() { _ = b.ln.Close() }

func (b *balancer) serve() {
	for {
		conn, err := b.ln.Accept()
		if err != nil {
			return
		}
		go b.forward(conn)
	}
}

// forward joins a client's connection to the next replica in rotation; a replica that
// refuses the connection is passed over, and the client's connection is closed when no
// replica takes it.
func (b *balancer) forward(client net.Conn) {
	defer func() { _ = client.Close() }()
	b.mu.Lock()
	backends := append([]string(nil), b.backends...)
	start := b.next
	b.next++
	b.mu.Unlock()
	var upstream net.Conn
	for i := range backends {
		c, err := net.Dial("tcp", backends[(start+i)%len(backends)])
		if err == nil {
			upstream = c
			break
		}
	}
	if upstream == nil {
		return
	}
	defer func() { _ = upstream.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(upstream, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, upstream); done <- struct{}{} }()
	<-done // either side ending ends both
}
