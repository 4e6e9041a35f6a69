package postgres_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

func testMigrations() postgres.Migrations {
	return postgres.Migrations{Service: "widgets", FS: os.DirFS("testdata/migrations")}
}

func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := postgres.Open(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// Two replicas starting together: exactly one applies each migration.
	const replicas = 2
	applied := make([]int, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { applied[i], errs[i] = postgres.Migrate(ctx, pool, testMigrations(), nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	if total := applied[0] + applied[1]; total != 2 {
		t.Fatalf("replicas applied %v migrations, want 2 in total", applied)
	}

	// A restart finds nothing to do.
	n, err := postgres.Migrate(ctx, pool, testMigrations(), nil)
	if err != nil || n != 0 {
		t.Fatalf("second Migrate = %d, %v; want 0, nil", n, err)
	}

	// The schema is the one both files describe.
	if _, err := pool.Exec(ctx, "INSERT INTO widgets (id, name) VALUES (1, 'a')"); err != nil {
		t.Fatal(err)
	}
	var color string
	if err := pool.QueryRow(ctx, "SELECT color FROM widgets WHERE id = 1").Scan(&color); err != nil || color != "blue" {
		t.Fatalf("color = %q, %v; want blue", color, err)
	}
	var versions int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM widgets_schema_version WHERE version_id > 0").Scan(&versions); err != nil || versions != 2 {
		t.Fatalf("version rows = %d, %v; want 2", versions, err)
	}
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		wantErr string
	}{
		{name: "empty", url: "", wantErr: "URL is required"},
		{name: "malformed keeps the password out", url: "postgres://u:secret@[::1", wantErr: "malformed"},
		{name: "unreachable", url: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1", wantErr: "not reachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			pool, err := postgres.Open(ctx, tt.url)
			if err == nil {
				pool.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "secret") {
				t.Fatalf("error %q; want it to contain %q and no password", err, tt.wantErr)
			}
		})
	}
}

// A service started before its database waits for it rather than failing.
func TestOpenWaitsForTheDatabase(t *testing.T) {
	own := pgtest.New(t) // paused below: the shared cluster must stay up for other tests
	url := own.NewDatabase(t)
	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		resumed <- own.Resume()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := postgres.Open(ctx, url)
	if rerr := <-resumed; rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("Open while the database starts: %v", err)
	}
	pool.Close()
}

func TestMigrateRejectsIncompleteSet(t *testing.T) {
	if _, err := postgres.Migrate(context.Background(), nil, postgres.Migrations{}, nil); err == nil {
		t.Fatal("Migrate accepted a set with no name or files")
	}
}
