package app_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }

func widgets() postgres.Migrations {
	return postgres.Migrations{Service: "widgets", FS: os.DirFS("../postgres/testdata/migrations")}
}

// syncBuffer collects log lines while the service writes them.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func schemaVersion(t *testing.T, url string) int64 {
	t.Helper()
	var exists bool
	pgtest.QueryRow(t, url, "SELECT to_regclass('widgets_schema_version') IS NOT NULL", &exists)
	var v int64
	if exists {
		pgtest.QueryRow(t, url, "SELECT max(version_id) FROM widgets_schema_version", &v)
	}
	return v
}

// TestMigrationModes: a service applies its migrations at start (apply, the default),
// or waits, applying nothing and not serving, until another process has applied them
// (wait), or applies them and ends without serving (the migrate command).
func TestMigrationModes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(ctx context.Context, url string, mode app.MigrateMode, log *slog.Logger, started func(app.Addrs)) error {
		cfg := app.Config{Name: "widgets", Listen: "127.0.0.1:0", DatabaseURL: url, Migrations: widgets(),
			Auth: auth.Config{Mode: auth.ModeNone}, Migrate: app.MigrateConfig{Mode: mode}}
		return app.Run(ctx, cfg, log, func(app.Deps) ([]app.Background, error) { return nil, nil }, started)
	}

	t.Run("apply", func(t *testing.T) {
		url := pg.NewDatabase(t)
		serving, stop := context.WithCancel(ctx)
		defer stop()
		cfg := app.Config{Name: "widgets", Listen: "127.0.0.1:0", DatabaseURL: url, Migrations: widgets(), Auth: auth.Config{Mode: auth.ModeNone}}
		started := make(chan struct{})
		go func() {
			_ = app.Run(serving, cfg, slog.New(slog.DiscardHandler), func(app.Deps) ([]app.Background, error) { return nil, nil },
				func(app.Addrs) { close(started) })
		}()
		<-started
		if v := schemaVersion(t, url); v != 2 {
			t.Fatalf("serving with the schema at version %d; want 2", v)
		}
	})

	t.Run("migrate command", func(t *testing.T) {
		url := pg.NewDatabase(t)
		err := app.Migrate(ctx, url, widgets(), app.MigrateConfig{LockTimeout: time.Second}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if v := schemaVersion(t, url); v != 2 {
			t.Fatalf("the schema is at version %d after migrate; want 2", v)
		}
	})

	for _, tt := range []struct {
		mode   app.MigrateMode
		serves bool
	}{{app.MigrateWait, true}, {app.WaitAndExit, false}} {
		t.Run(string(tt.mode), func(t *testing.T) {
			started := make(chan struct{})
			done := make(chan error, 1)
			url := pg.NewDatabase(t)
			serving, stop := context.WithCancel(ctx)
			defer func() {
				stop()
				select { // Run ends once its context does, unless a failure above took its result
				case <-done:
				case <-time.After(30 * time.Second):
				}
			}()
			var logs syncBuffer
			log := slog.New(slog.NewJSONHandler(&logs, nil))
			go func() {
				if tt.serves {
					done <- run(serving, url, tt.mode, log, func(app.Addrs) { close(started) })
				} else {
					done <- app.Migrate(serving, url, widgets(), app.MigrateConfig{Mode: tt.mode}, log)
				}
			}()
			// It says why it waits, and neither migrates nor serves meanwhile.
			for !strings.Contains(logs.String(), "waiting for the schema") {
				select {
				case <-started:
					t.Fatalf("serving before the migrations were applied; schema at version %d", schemaVersion(t, url))
				case err := <-done:
					t.Fatalf("ended before the migrations were applied: %v", err)
				case <-ctx.Done():
					t.Fatal("no log of the wait")
				case <-time.After(20 * time.Millisecond):
				}
			}
			if v := schemaVersion(t, url); v != 0 {
				t.Fatalf("a waiting service applied migrations: schema at version %d", v)
			}
			if err := app.Migrate(ctx, url, widgets(), app.MigrateConfig{}, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-started:
			case err := <-done:
				if tt.serves || err != nil {
					t.Fatalf("ended: %v", err)
				}
				done <- nil // for the deferred wait
			}
		})
	}
}
