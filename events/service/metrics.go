package service

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flytekube/backend/events/watch"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
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

	// By cluster: the events each cluster sent, and when it last sent one.
	receivedByCluster *prometheus.CounterVec
	clusterLastEvent  *prometheus.GaugeVec
	clusters          clusterLabels
}

// maxClusterLabels bounds the clusters the by-cluster metrics name: as many as
// --auth-clusters-file lists. A cluster is any name a caller puts in its events, so
// beyond these they are counted together, as otherCluster.
const maxClusterLabels = 64

// otherCluster is the label of the clusters past maxClusterLabels; no cluster name has
// parentheses in practice, and one that had would only share its series.
const otherCluster = "(other)"

// clusterLabels hands out the label of each cluster, the first maxClusterLabels names
// seen each their own.
type clusterLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

func (c *clusterLabels) of(cluster string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[cluster]; ok {
		return cluster
	}
	if len(c.seen) >= maxClusterLabels {
		return otherCluster
	}
	if c.seen == nil {
		c.seen = make(map[string]struct{})
	}
	c.seen[cluster] = struct{}{}
	return cluster
}

// receivedFrom counts a batch's events by cluster, and marks when each cluster last
// sent one. A batch is one executor's, so mostly one cluster.
func (m *Metrics) receivedFrom(events []*eventsv1.ActionEvent) {
	now := float64(time.Now().UnixNano()) / 1e9
	last, n := "", 0
	flush := func() {
		if n > 0 {
			label := m.clusters.of(last)
			m.receivedByCluster.WithLabelValues(label).Add(float64(n))
			m.clusterLastEvent.WithLabelValues(label).Set(now)
		}
	}
	for _, ev := range events {
		if c := ev.GetCluster(); c != last || n == 0 {
			flush()
			last, n = c, 0
		}
		n++
	}
	flush()
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
		receivedByCluster: instrument.CounterVec("flyte_events_received_by_cluster_total",
			"Events received by Record, new or not, by the cluster they name (the first 64 clusters seen; the others as \"(other)\").", "cluster"),
		clusterLastEvent: instrument.GaugeVec("flyte_events_cluster_last_event_timestamp_seconds",
			"When this replica last received an event of each cluster, in Unix seconds (clusters as in flyte_events_received_by_cluster_total).", "cluster"),
	}
	if err := instrument.Register(reg, m.received, m.recorded, m.duplicates, m.batchSize, m.record, m.watchers, m.watchEnded, m.refused,
		m.receivedByCluster, m.clusterLastEvent,
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
