// Package testserver gives tests a server process (Postgres, Jaeger) for the whole test
// package (Main) or for one test (Start).
package testserver

import (
	"fmt"
	"os"
	"testing"
)

// Server is what pgtest and jaegertest start.
type Server interface{ Stop() error }

// Main starts a server with start, points *s at it, runs the package's tests and stops
// the server; call it from TestMain and exit with its result.
func Main[S Server](m *testing.M, s *S, start func() (S, error)) int {
	srv, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*s = srv
	code := m.Run()
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}

// Start starts a server with start for one test and stops it when the test ends; it
// fails the test when the server does not start.
func Start[S Server](t testing.TB, start func() (S, error)) S {
	t.Helper()
	srv, err := start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	return srv
}
