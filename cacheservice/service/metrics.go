package service

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/internal/instrument"
)

// Metrics are the cache service's Prometheus instruments.
type Metrics struct {
	gets         *prometheus.CounterVec
	puts         *prometheus.CounterVec
	deleted      prometheus.Counter
	reservations *prometheus.CounterVec
	releases     *prometheus.CounterVec
	cleaned      *prometheus.CounterVec
	evicted      prometheus.Counter
	evictedBytes prometheus.Counter
	hitsDropped  prometheus.Counter
}

// NewMetrics creates the instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		gets: instrument.CounterVec("flyte_cache_gets_total",
			"Get calls by result: hit or miss.", "result", "hit", "miss"),
		puts: instrument.CounterVec("flyte_cache_puts_total",
			"Put calls by result: stored (new entry), replaced (overwrite or expired entry) or conflict (AlreadyExists).",
			"result", "stored", "replaced", "conflict"),
		deleted: instrument.Counter("flyte_cache_entries_deleted_total",
			"Entries removed by Delete and Invalidate."),
		reservations: instrument.CounterVec("flyte_cache_reservations_total",
			"GetOrExtendReservation calls by result: granted, extended, taken_over or refused.",
			"result", "granted", "extended", "taken_over", "refused"),
		releases: instrument.CounterVec("flyte_cache_reservation_releases_total",
			"ReleaseReservation calls by result: released, or ignored (not held by the caller).",
			"result", "released", "ignored"),
		cleaned: instrument.CounterVec("flyte_cache_cleanup_deleted_total",
			"Rows removed by the background cleanup, by kind: reservation (expired) or entry (past the TTL).",
			"kind", "reservation", "entry"),
		evicted: instrument.Counter("flyte_cache_evicted_entries_total",
			"Entries evicted, least recently used first, from projects past their bound on entries or on the outputs' size."),
		evictedBytes: instrument.Counter("flyte_cache_evicted_bytes_total",
			"The outputs' size (as their writers told it) of the evicted entries."),
		hitsDropped: instrument.Counter("flyte_cache_hits_unrecorded_total",
			"Hits not recorded for eviction's order because more distinct entries were hit between two flushes than are kept."),
	}
	if err := instrument.Register(reg, m.gets, m.puts, m.deleted, m.reservations, m.releases, m.cleaned,
		m.evicted, m.evictedBytes, m.hitsDropped, buildinfo.Metric("flyte_cache_build_info")); err != nil {
		return nil, fmt.Errorf("cache: registering metrics: %w", err)
	}
	return m, nil
}

// Cleaned counts rows removed by the background cleanup.
func (m *Metrics) Cleaned(kind string, n int64) { m.cleaned.WithLabelValues(kind).Add(float64(n)) }

// Evicted counts entries evicted and their outputs' size.
func (m *Metrics) Evicted(entries, bytes int64) {
	m.evicted.Add(float64(entries))
	m.evictedBytes.Add(float64(bytes))
}

// HitsDropped counts hits not recorded.
func (m *Metrics) HitsDropped(n int) { m.hitsDropped.Add(float64(n)) }
