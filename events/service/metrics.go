package service

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/events/watch"
)

// Metrics are the service's Prometheus instruments.
type Metrics struct {
	received   prometheus.Counter
	recorded   prometheus.Counter
	duplicates prometheus.Counter
	batchSize  prometheus.Histogram
	record     *prometheus.HistogramVec
	watchers   prometheus.Gauge
	watchEnded *prometheus.CounterVec
	refused    *prometheus.CounterVec
}

// NewMetrics creates the instruments and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_events_received_total",
			Help: "Events received by Record, new or not.",
		}),
		recorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_events_recorded_total",
			Help: "Events stored for the first time.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_events_duplicates_total",
			Help: "Events absorbed because they were already stored.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flyte_events_record_batch_size",
			Help:    "Events per Record call.",
			Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000},
		}),
		record: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "flyte_events_record_duration_seconds",
			Help:    "Time to store a Record batch, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"outcome"}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flyte_events_watchers",
			Help: "WatchActions streams open on this replica.",
		}),
		watchEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_events_watchers_ended_total",
			Help: "WatchActions streams ended by the server, by reason (overflow, resync, shutdown).",
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_events_watchers_refused_total",
			Help: "WatchActions streams refused with ResourceExhausted, by the limit they met (service, identity).",
		}, []string{"limit"}),
	}
	// Every known label value starts at zero, so a series is there before its first event.
	for _, reason := range []string{"overflow", "resync", "shutdown"} {
		m.watchEnded.WithLabelValues(reason)
	}
	for _, outcome := range []string{"ok", "error"} {
		m.record.WithLabelValues(outcome)
	}
	for _, limit := range []string{"service", "identity"} {
		m.refused.WithLabelValues(limit)
	}
	for _, c := range []prometheus.Collector{m.received, m.recorded, m.duplicates, m.batchSize, m.record, m.watchers, m.watchEnded, m.refused} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("events: registering metrics: %w", err)
		}
	}
	return m, nil
}

// Watch returns the hub callbacks that keep the watcher metrics.
func (m *Metrics) Watch() watch.Metrics {
	return watch.Metrics{
		Watchers: func(n int) { m.watchers.Set(float64(n)) },
		Ended:    func(reason string) { m.watchEnded.WithLabelValues(reason).Inc() },
		Refused:  func(limit string) { m.refused.WithLabelValues(limit).Inc() },
	}
}
