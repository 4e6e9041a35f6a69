package service

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/events/watch"
	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/internal/instrument"
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
		received:   instrument.Counter("flyte_events_received_total", "Events received by Record, new or not."),
		recorded:   instrument.Counter("flyte_events_recorded_total", "Events stored for the first time."),
		duplicates: instrument.Counter("flyte_events_duplicates_total", "Events absorbed because they were already stored."),
		batchSize: instrument.Histogram("flyte_events_record_batch_size", "Events per Record call.",
			[]float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000}),
		// Deprecated: otelconnect's rpc_server_call_duration_seconds times every RPC,
		// Record included. Kept one release for the dashboards that read it
		// (docs/metrics.md), then removed.
		record: instrument.HistogramVec("flyte_events_record_duration_seconds", "Deprecated: use rpc_server_call_duration_seconds of Record. Time to store a Record batch, by outcome.",
			prometheus.ExponentialBuckets(0.0005, 2, 16), "outcome", "ok", "error"),
		watchers: instrument.Gauge("flyte_events_watchers", "WatchActions streams open on this replica."),
		watchEnded: instrument.CounterVec("flyte_events_watchers_ended_total",
			"WatchActions streams ended by the server, by reason (overflow, resync, shutdown).",
			"reason", "overflow", "resync", "shutdown"),
		refused: instrument.CounterVec("flyte_events_watchers_refused_total",
			"WatchActions streams refused with ResourceExhausted, by the limit they met (service, identity).",
			"limit", "service", "identity"),
	}
	if err := instrument.Register(reg, m.received, m.recorded, m.duplicates, m.batchSize, m.record, m.watchers, m.watchEnded, m.refused,
		buildinfo.Metric("flyte_events_build_info")); err != nil {
		return nil, fmt.Errorf("events: registering metrics: %w", err)
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
