package cacheservice

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/flytekube/backend/services/app"
)

// Flags registers the cacheservice command's flags on fs, to be parsed into cfg. The
// command parses its arguments with them, and deploy's tests parse the arguments docker
// compose and the manifests give it.
func Flags(fs *flag.FlagSet, cfg *Config) {
	defaults := Config{}.WithDefaults()
	fs.StringVar(&cfg.Listen, "listen", defaults.Listen, "address for Connect, gRPC and gRPC-Web")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", ":9094", "address for Prometheus /metrics; empty disables it")
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
	app.MigrateFlags(fs, &cfg.Migrate)
	fs.DurationVar(&cfg.MaxHeartbeat, "max-heartbeat", defaults.MaxHeartbeat, "longest heartbeat interval granted to a reservation")
	fs.DurationVar(&cfg.MinHeartbeat, "min-heartbeat", defaults.MinHeartbeat, "shortest heartbeat interval granted to a reservation, whatever a caller asks for")
	fs.IntVar(&cfg.HeartbeatGraceMultiplier, "heartbeat-grace-multiplier", defaults.HeartbeatGraceMultiplier, "a reservation expires after this many heartbeat intervals without one")
	fs.DurationVar(&cfg.EntryTTL, "entry-ttl", 0, "delete entries this long after they were last written; 0 keeps them")
	fs.DurationVar(&cfg.CleanupInterval, "cleanup-interval", defaults.CleanupInterval, "how often expired reservations and old entries are removed, hits recorded and projects past their bound evicted")
	fs.Int64Var(&cfg.ProjectBound.Entries, "max-entries-per-project", defaults.ProjectBound.Entries, "entries a project's cache holds before the least recently used are evicted")
	cfg.ProjectBound.OutputBytes = defaults.ProjectBound.OutputBytes
	fs.Func("max-output-bytes-per-project", "total size of a project's cached outputs (as a quantity: 500Gi) before the least recently used entries are evicted (default 1Ti)", func(v string) error {
		n, err := parseBytes(v)
		cfg.ProjectBound.OutputBytes = n
		return err
	})
	fs.Func("project-bound", "PROJECT=ENTRIES,BYTES: a project's own bound instead of the two above (BYTES a quantity: 10Gi); repeat for more projects", func(v string) error {
		project, bound, err := parseProjectBound(v)
		if err != nil {
			return err
		}
		if cfg.ProjectBounds == nil {
			cfg.ProjectBounds = map[string]Bound{}
		}
		cfg.ProjectBounds[project] = bound
		return nil
	})
	fs.IntVar(&cfg.MaxPendingHits, "max-pending-hits", defaults.MaxPendingHits, "distinct entries whose hits are held between two cleanup passes for eviction's order")
	app.SecurityFlags(fs, &cfg.Server, &cfg.Auth)
}

// parseBytes reads a size given as a Kubernetes quantity (1Ti, 500Gi, 1000000).
func parseBytes(v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("not a quantity: %w", err)
	}
	n, ok := q.AsInt64()
	if !ok || n <= 0 {
		return 0, fmt.Errorf("%s: must be a positive whole number of bytes", v)
	}
	return n, nil
}

// parseProjectBound reads PROJECT=ENTRIES,BYTES.
func parseProjectBound(v string) (string, Bound, error) {
	project, bound, ok := strings.Cut(v, "=")
	entries, size, ok2 := strings.Cut(bound, ",")
	if !ok || !ok2 || project == "" {
		return "", Bound{}, errors.New("want PROJECT=ENTRIES,BYTES, such as ml=100000,500Gi")
	}
	n, err := strconv.ParseInt(entries, 10, 64)
	if err != nil || n <= 0 {
		return "", Bound{}, fmt.Errorf("entries %q: must be a positive whole number", entries)
	}
	b, err := parseBytes(size)
	if err != nil {
		return "", Bound{}, err
	}
	return project, Bound{Entries: n, OutputBytes: b}, nil
}
