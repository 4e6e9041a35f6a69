package service

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the cache service's Prometheus instruments.
type Metrics struct {
	gets         *prometheus.CounterVec
	puts         *prometheus.CounterVec
	deleted      prometheus.Counter
	reservations *prometheus.CounterVec
	releases     *prometheus.CounterVec
	cleaned      *prometheus.CounterVec
}

// NewMetrics creates the instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		gets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_cache_gets_total",
			Help: "Get calls by result: hit or miss.",
		}, []string{"result"}),
		puts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_cache_puts_total",
			Help: "Put calls by result: stored (new entry), replaced (overwrite or expired entry) or conflict (AlreadyExists).",
		}, []string{"result"}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_cache_entries_deleted_total",
			Help: "Entries removed by Delete and Invalidate.",
		}),
		reservations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_cache_reservations_total",
			Help: "GetOrExtendReservation calls by result: granted, extended, taken_over or refused.",
		}, []string{"result"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_cache_reservation_releases_total",
			Help: "ReleaseReservation calls by result: released, or ignored (not held by the caller).",
		}, []string{"result"}),
		cleaned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_cache_cleanup_deleted_total",
			Help: "Rows removed by the background cleanup, by kind: reservation (expired) or entry (past the TTL).",
		}, []string{"kind"}),
	}
	// Every known label value starts at zero, so a series is there before its first call.
	for vec, values := range map[*prometheus.CounterVec][]string{
		m.gets: {"hit", "miss"}, m.puts: {"stored", "replaced", "conflict"},
		m.reservations: {"granted", "extended", "taken_over", "refused"},
		m.releases:     {"released", "ignored"}, m.cleaned: {"reservation", "entry"},
	} {
		for _, v := range values {
			vec.WithLabelValues(v)
		}
	}
	for _, c := range []prometheus.Collector{m.gets, m.puts, m.deleted, m.reservations, m.releases, m.cleaned} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("cache: registering metrics: %w", err)
		}
	}
	return m, nil
}

// Cleaned counts rows removed by the background cleanup.
func (m *Metrics) Cleaned(kind string, n int64) { m.cleaned.WithLabelValues(kind).Add(float64(n)) }
