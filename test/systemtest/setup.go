package systemtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// InstallCRD applies the CRD in the YAML file at path (server-side, as owner) and waits
// until it is served. Applied over an older version of itself, it is the upgrade of the
// CRD.
func InstallCRD(ctx context.Context, c client.Client, path, owner string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("CRD: %w", err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		return fmt.Errorf("CRD %s: %w", path, err)
	}
	crd := &unstructured.Unstructured{Object: obj}
	if err := c.Patch(ctx, crd, client.Apply, client.FieldOwner(owner), client.ForceOwnership); err != nil {
		return fmt.Errorf("installing the CRD of %s: %w", path, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if err := c.Get(ctx, client.ObjectKeyFromObject(crd), crd); err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return errors.New("the CRD of " + path + " was not established within a minute")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the CRD of %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

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
