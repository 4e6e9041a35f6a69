package cacheservice

import (
	"flag"
	"os"

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
	fs.DurationVar(&cfg.MaxHeartbeat, "max-heartbeat", defaults.MaxHeartbeat, "longest heartbeat interval granted to a reservation")
	fs.DurationVar(&cfg.MinHeartbeat, "min-heartbeat", defaults.MinHeartbeat, "shortest heartbeat interval granted to a reservation, whatever a caller asks for")
	fs.IntVar(&cfg.HeartbeatGraceMultiplier, "heartbeat-grace-multiplier", defaults.HeartbeatGraceMultiplier, "a reservation expires after this many heartbeat intervals without one")
	fs.DurationVar(&cfg.EntryTTL, "entry-ttl", 0, "delete entries this long after they were last written; 0 keeps them")
	fs.DurationVar(&cfg.CleanupInterval, "cleanup-interval", defaults.CleanupInterval, "how often expired reservations and old entries are removed")
	app.SecurityFlags(fs, &cfg.Server, &cfg.Auth)
}
