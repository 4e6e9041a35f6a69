package relay

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/internal/instrument"
)

// Metrics are the relay's instruments, by sink. A nil *Metrics records nothing.
type Metrics struct {
	leader       prometheus.Gauge
	publishedN   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	replays      *prometheus.CounterVec
	lag          *prometheus.HistogramVec
	pending      *prometheus.GaugeVec
	oldest       *prometheus.GaugeVec
	trimmedTotal prometheus.Counter
}

// NewMetrics registers the relay's instruments with reg; sinks are the configured sinks'
// names, whose series start at zero.
func NewMetrics(reg prometheus.Registerer, sinks []string) (*Metrics, error) {
	m := &Metrics{
		leader: instrument.Gauge("flyte_events_cloudevents_leader",
			"1 while this replica relays the outbox to the CloudEvents sinks."),
		publishedN: instrument.CounterVec("flyte_events_cloudevents_published_total",
			"Events a CloudEvents sink acknowledged, by sink.", "sink", sinks...),
		retries: instrument.CounterVec("flyte_events_cloudevents_retries_total",
			"Publishing passes a CloudEvents sink ended with a transient failure, sent again after a backoff, by sink.", "sink", sinks...),
		deadLetters: instrument.CounterVec("flyte_events_cloudevents_dead_letters_total",
			"Events a CloudEvents sink refused for good, kept as dead letters, by sink.", "sink", sinks...),
		replays: instrument.CounterVec("flyte_events_cloudevents_replayed_total",
			"Dead letters published on a replay, by sink.", "sink", sinks...),
		lag: instrument.HistogramVec("flyte_events_cloudevents_lag_seconds",
			"Time from the start of the transaction that recorded an event to its sink's acknowledgement, by sink.",
			prometheus.ExponentialBuckets(0.005, 2, 14), "sink", sinks...),
		pending: instrument.GaugeVec("flyte_events_cloudevents_pending",
			"Events queued for a CloudEvents sink and not yet handed to it (counted up to 100,000), by sink.", "sink", sinks...),
		oldest: instrument.GaugeVec("flyte_events_cloudevents_oldest_pending_age_seconds",
			"Age of the oldest event queued for a CloudEvents sink and not yet handed to it, by sink; 0 when none is.", "sink", sinks...),
		trimmedTotal: instrument.Counter("flyte_events_cloudevents_outbox_trimmed_total",
			"Outbox entries deleted once every sink had them."),
	}
	if err := instrument.Register(reg, m.leader, m.publishedN, m.retries, m.deadLetters, m.replays, m.lag, m.pending, m.oldest, m.trimmedTotal); err != nil {
		return nil, fmt.Errorf("relay: registering metrics: %w", err)
	}
	return m, nil
}

func (m *Metrics) leading(on bool) {
	if m == nil {
		return
	}
	if on {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

func (m *Metrics) published(sink string, lag time.Duration) {
	if m == nil {
		return
	}
	m.publishedN.WithLabelValues(sink).Inc()
	m.lag.WithLabelValues(sink).Observe(lag.Seconds())
}

func (m *Metrics) retried(sink string) {
	if m != nil {
		m.retries.WithLabelValues(sink).Inc()
	}
}

func (m *Metrics) deadLettered(sink string) {
	if m != nil {
		m.deadLetters.WithLabelValues(sink).Inc()
	}
}

func (m *Metrics) replayed(sink string) {
	if m != nil {
		m.replays.WithLabelValues(sink).Inc()
	}
}

func (m *Metrics) trimmed(n int) {
	if m != nil {
		m.trimmedTotal.Add(float64(n))
	}
}

func (m *Metrics) backlog(sink string, n int64, oldest time.Time) {
	if m == nil {
		return
	}
	m.pending.WithLabelValues(sink).Set(float64(n))
	age := 0.0
	if !oldest.IsZero() {
		age = time.Since(oldest).Seconds()
	}
	m.oldest.WithLabelValues(sink).Set(age)
}
