// Package natstest runs NATS servers in a test's process: the JetStream broker the
// CloudEvents sinks, the relay and compose's stand-in publish to.
package natstest

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Run starts a server with opts, quiet and deaf to signals, and stops it when the test
// ends.
func Run(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("the NATS server did not start")
	}
	return s
}

// JetStream starts a server with JetStream on 127.0.0.1:port (0: a free port), storing
// in dir, with tune's changes to its options.
func JetStream(t testing.TB, dir string, port int, tune ...func(*server.Options)) *server.Server {
	t.Helper()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir}
	for _, f := range tune {
		f(opts)
	}
	return Run(t, opts)
}

// Port is the port the server listens on for clients.
func Port(s *server.Server) int { return s.Addr().(*net.TCPAddr).Port }
