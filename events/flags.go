package events

import (
	"flag"
	"fmt"
	"os"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/services/app"
)

// Flags registers the events command's flags on fs, to be parsed into cfg. The command
// parses its arguments with them, and deploy's tests parse the arguments docker compose
// and the manifests give it.
func Flags(fs *flag.FlagSet, cfg *Config) {
	defaults := Config{}.WithDefaults()
	fs.StringVar(&cfg.Listen, "listen", ":8090", "address for Connect, gRPC and gRPC-Web")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", ":9090", "address for Prometheus /metrics; empty disables it")
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
	app.MigrateFlags(fs, &cfg.Migrate)
	fs.DurationVar(&cfg.RetentionTTL, "retention-ttl", 0, "delete finished actions and their events this long after they finished; 0 keeps them")
	fs.DurationVar(&cfg.RetentionUnfinishedTTL, "retention-unfinished-ttl", 0, "delete an unfinished action and its events once its newest event is this old (its executor is gone); 0 is 4 times --retention-ttl; needs --retention-ttl")
	fs.DurationVar(&cfg.RetentionInterval, "retention-interval", defaults.RetentionInterval, "how often partitions are made ahead and retention runs")
	fs.IntVar(&cfg.RetentionBatch, "retention-batch", defaults.RetentionBatch, "actions retention deletes or re-files per transaction")
	fs.DurationVar(&cfg.PartitionWidth, "partition-width", defaults.PartitionWidth, "span of filing times one partition of the events table holds; history is kept up to this much beyond --retention-ttl")
	fs.IntVar(&cfg.WatchBuffer, "watch-buffer", defaults.WatchBuffer, "updates queued per watcher before it is ended")
	fs.IntVar(&cfg.MaxWatchers, "max-watchers", defaults.MaxWatchers, "WatchActions streams this replica serves at once; more are refused with ResourceExhausted")
	fs.IntVar(&cfg.MaxWatchersPerIdentity, "max-watchers-per-identity", defaults.MaxWatchersPerIdentity, "WatchActions streams one caller may hold on this replica")
	fs.IntVar(&cfg.MaxResponseBytes, "max-response-bytes", defaults.MaxResponseBytes, "bytes a listing's page may hold; a page ends early, with a token for the next")
	fs.StringVar(&cfg.ConsoleListen, "console-listen", "", "address for the web console, at /console/: over TLS with the service's certificate, or plain HTTP on a loopback address without one; empty disables it")
	fs.BoolVar(&cfg.ConsolePlaintext, "console-plaintext", false, "serve the console in plain HTTP on its loopback address even when the service has a TLS certificate, for a browser on the same machine")
	fs.StringVar(&cfg.JaegerQueryURL, "jaeger-query-url", "", "Jaeger's query API, where the console finds an action's traces; empty shows none")
	fs.StringVar(&cfg.JaegerUIURL, "jaeger-ui-url", "", "a Jaeger UI the console links each trace to; empty links none")
	fs.StringVar(&cfg.CloudEventsConfig, "cloudevents-config", "", "YAML `file` of the sinks every recorded event is published to as a CloudEvent: HTTP receivers, NATS JetStream subjects, Kafka topics, with their filters (docs/events.md)")
	fs.Func("cloudevents-sink", "publish every recorded event as a CloudEvent to this sink as well (repeatable): an http(s)://host/path, nats://host:port/SUBJECT or kafka://host:port/TOPIC `URL`, with name= and no other option (the rest is --cloudevents-config's)", func(raw string) error {
		sink, err := cloudevents.Parse(raw)
		if err != nil {
			return fmt.Errorf("cloudevents-sink: %w", err)
		}
		cfg.CloudEvents.Sinks = append(cfg.CloudEvents.Sinks, sink)
		return nil
	})
	fs.DurationVar(&cfg.CloudEvents.ForgetSinksAfter, "cloudevents-forget-sink-after", defaults.CloudEvents.ForgetSinksAfter, "how long the relay keeps the cursor of a sink no replica has said it is configured with (a rollout adding a sink runs replicas that do not know it)")
	fs.Func("cloudevents-unregister-sink", "delete the cursor of this sink `NAME` at start, for a sink taken out of every replica's configuration (repeatable); its dead letters stay", func(name string) error {
		cfg.CloudEventsUnregister = append(cfg.CloudEventsUnregister, name)
		return nil
	})
	fs.StringVar(&cfg.CloudEvents.Cluster, "cloudevents-cluster", "default", "this cluster's name in each CloudEvent's source (flyte://CLUSTER/PROJECT/DOMAIN)")
	app.SecurityFlags(fs, &cfg.Server, &cfg.Auth)
}
