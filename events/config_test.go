package events_test

import (
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/services/auth"
)

// The retention and CloudEvents settings added for bounded state are checked at start.
func TestConfigValidatesRetentionAndSinkSettings(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*events.Config)
		want   string // a part of the error; empty: valid
	}{
		{"defaults", func(*events.Config) {}, ""},
		{"an unfinished TTL well above the TTL", func(c *events.Config) {
			c.RetentionTTL, c.RetentionUnfinishedTTL = 720*time.Hour, 2160*time.Hour
		}, ""},
		{"an unfinished TTL without a TTL", func(c *events.Config) { c.RetentionUnfinishedTTL = time.Hour }, "needs --retention-ttl"},
		{"an unfinished TTL below the TTL and a partition", func(c *events.Config) {
			c.RetentionTTL, c.RetentionUnfinishedTTL = 720*time.Hour, 730*time.Hour
		}, "at least --retention-ttl plus --partition-width"},
		{"a negative unfinished TTL", func(c *events.Config) { c.RetentionUnfinishedTTL = -time.Second }, "must not be negative"},
		{"forgetting sinks within minutes", func(c *events.Config) { c.CloudEvents.ForgetSinksAfter = time.Minute }, "cloudevents-forget-sink-after"},
		{"unregistering no sink of its own", func(c *events.Config) { c.CloudEventsUnregister = []string{"old"} }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := events.Config{DatabaseURL: "postgres://localhost/events", Auth: auth.Config{Mode: auth.ModeNone}}
			tc.mutate(&cfg)
			err := cfg.WithDefaults().Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v; want it valid", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v; want an error with %q", err, tc.want)
			}
		})
	}
}
