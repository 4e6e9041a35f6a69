// Package pgtest gives tests a real Postgres: one throwaway cluster per test package,
// started by hack/postgres.sh (or TEST_DATABASE_URL when set), and one fresh database
// per test.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/testserver"
)

// Server is a running Postgres cluster.
type Server struct {
	// URL connects to the cluster's maintenance database as a superuser.
	URL string
	dir string // "-" when the cluster is not ours to stop
}

// Start starts a throwaway cluster with hack/postgres.sh, or names the one
// TEST_DATABASE_URL gives.
func Start() (*Server, error) { return start(os.Environ()) }

// startOwn starts a throwaway cluster whatever TEST_DATABASE_URL says: one a test may
// pause and resume.
func startOwn() (*Server, error) {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TEST_DATABASE_URL=") })
	return start(env)
}

func start(env []string) (*Server, error) {
	script, err := repo.Path("hack", "postgres.sh")
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd := exec.Command(script, "start")
	cmd.Env = env
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("pgtest: %s start: %w\n%s", script, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("pgtest: unexpected output from %s: %q", script, out)
	}
	return &Server{dir: lines[len(lines)-2], URL: lines[len(lines)-1]}, nil
}

// ErrNotOurs is returned for what only a server this package started can do (pause it,
// name its processes), asked of one given by TEST_DATABASE_URL. A test that needs it
// takes a cluster of its own from New.
var ErrNotOurs = errors.New("pgtest: the server given by TEST_DATABASE_URL is not ours")

// PID returns the process ID of the cluster's postmaster, whose children are the
// server's backends; a cluster given by TEST_DATABASE_URL has none known.
func (s *Server) PID() (int, error) {
	if s.dir == "-" {
		return 0, ErrNotOurs
	}
	data, err := os.ReadFile(filepath.Join(s.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("pgtest: postmaster.pid: %w", err)
	}
	return pid, nil
}

// Stop stops the cluster and removes its files.
func (s *Server) Stop() error { return s.script("stop") }

// Pause stops the server but keeps its data, as in an outage; Resume starts it again on
// the same address. A cluster given by TEST_DATABASE_URL cannot be paused.
func (s *Server) Pause() error {
	if s.dir == "-" {
		return ErrNotOurs
	}
	return s.script("pause")
}

// Resume restarts a paused server.
func (s *Server) Resume() error { return s.script("resume") }

func (s *Server) script(verb string) error {
	script, err := repo.Path("hack", "postgres.sh")
	if err != nil {
		return err
	}
	if out, err := exec.Command(script, verb, s.dir).CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: postgres.sh %s: %w: %s", verb, err, out)
	}
	return nil
}

// Main runs a test package's tests against a cluster started for them; call it from
// TestMain and exit with its result.
func Main(m *testing.M, srv **Server) int { return testserver.Main(m, srv, Start) }

// New starts a throwaway cluster for one test (one it may pause, or in a package without
// Main), even when TEST_DATABASE_URL names a server, and stops it when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	return testserver.Start(t, startOwn)
}

// NewDatabase creates an empty database for one test, drops it when the test ends, and
// returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("pgtest: connecting to %s: %v", s.URL, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()

	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	name := "t_" + hex.EncodeToString(suffix[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: creating database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.URL)
		if err != nil {
			t.Errorf("pgtest: connecting to drop %s: %v", name, err)
			return
		}
		defer func() { _ = conn.Close(context.Background()) }()
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: dropping %s: %v", name, err)
		}
	})

	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatalf("pgtest: parsing %s: %v", s.URL, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Exec runs sql on the database at dbURL over a connection of its own, failing the test
// when it fails.
func Exec(t testing.TB, dbURL, sql string) {
	t.Helper()
	withConn(t, dbURL, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql)
		return err
	})
}

// QueryRow runs query on the database at dbURL over a connection of its own, closed
// after (tests call it in loops), and scans its one row into dest.
func QueryRow(t testing.TB, dbURL, query string, dest ...any) {
	t.Helper()
	withConn(t, dbURL, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, query).Scan(dest...)
	})
}

func withConn(t testing.TB, dbURL string, f func(context.Context, *pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("pgtest: connecting: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if err := f(ctx, conn); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// StartOnPort starts a throwaway cluster (whatever TEST_DATABASE_URL says) that also
// listens on 127.0.0.1:port, for clients that cannot reach its socket: pods, which have a
// mount namespace of their own. Its URL names that address.
func StartOnPort(port int) (*Server, error) {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TEST_DATABASE_URL=") })
	return start(append(env, "FLYTE_PG_TCP_PORT="+strconv.Itoa(port)))
}
