package systemtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// CreateDatabase creates the database name on the server of maintenanceURL (whose
// database is postgres) and returns its URL.
func CreateDatabase(ctx context.Context, maintenanceURL, name string) (string, error) {
	conn, err := pgx.Connect(ctx, maintenanceURL)
	if err != nil {
		return "", fmt.Errorf("connecting to Postgres: %w", err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("creating the database %s: %w", name, err)
	}
	return strings.Replace(maintenanceURL, "/postgres?", "/"+name+"?", 1), nil
}

// Programs are the system's programs, by the name each runs under, and their packages.
var Programs = map[string]string{
	"events":       "./events/cmd/events",
	"cacheservice": "./cacheservice/cmd/cacheservice",
	"executor":     "./executor/cmd/executor",
}

// BinDir is where a test named test keeps the tree's programs between runs, outside the
// clone, as the sandbox does: go build then relinks only what changed.
func BinDir(test string) string {
	if d := os.Getenv("FLYTE_CACHE_DIR"); d != "" {
		return filepath.Join(d, test+"-bin")
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return filepath.Join(cache, "flyte-executor", test+"-bin")
}

// Build compiles the programs of the tree at root into dir and returns their paths by name.
func Build(ctx context.Context, root, dir string) (map[string]string, error) {
	args := []string{"build", "-o", dir + "/"}
	bins := map[string]string{}
	for name, pkg := range Programs {
		args = append(args, pkg)
		bins[name] = filepath.Join(dir, name)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bins, nil
}
