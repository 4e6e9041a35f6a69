package fairqueue

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a queue's instruments, one series per tenant; a tenant's series go when
// the queue forgets it (IdleAfter), so that their number follows the tenants active, not
// all those ever seen. A nil *Metrics records nothing.
type Metrics struct {
	depth    *prometheus.GaugeVec
	wait     *prometheus.HistogramVec
	promoted *prometheus.CounterVec
}

// NewMetrics registers flyte_executor_queue_depth, flyte_executor_queue_wait_seconds and
// flyte_executor_queue_promoted_total with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "flyte_executor_queue_depth",
			Help: "Actions ready and waiting for a worker in the executor's work queue, by namespace."},
			[]string{"namespace"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "flyte_executor_queue_wait_seconds",
			Help:    "Time an action waited in the work queue from when it was due until a worker took it, by namespace.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}},
			[]string{"namespace"}),
		promoted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flyte_executor_queue_promoted_total",
			Help: "Actions promoted in the work queue to the highest priority with work after waiting behind it for the queue's promoteAfter (after a failover: the new leader's first list and its requeues, behind new work), by namespace."},
			[]string{"namespace"}),
	}
	for _, c := range []prometheus.Collector{m.depth, m.wait, m.promoted} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the work queue's metrics: %w", err)
		}
	}
	return m, nil
}

// tenantStats are one tenant's series, looked up once.
type tenantStats struct {
	gauge    prometheus.Gauge
	observer prometheus.Observer
	promotes prometheus.Counter
}

func (m *Metrics) tenant(name string) *tenantStats {
	if m == nil {
		return nil
	}
	return &tenantStats{gauge: m.depth.WithLabelValues(name), observer: m.wait.WithLabelValues(name),
		promotes: m.promoted.WithLabelValues(name)}
}

func (m *Metrics) forget(name string) {
	if m == nil {
		return
	}
	m.depth.DeleteLabelValues(name)
	m.wait.DeleteLabelValues(name)
	m.promoted.DeleteLabelValues(name)
}

func (s *tenantStats) depth(n int) {
	if s != nil {
		s.gauge.Set(float64(n))
	}
}

func (s *tenantStats) waited(d time.Duration) {
	if s != nil {
		s.observer.Observe(d.Seconds())
	}
}

func (s *tenantStats) promoted() {
	if s != nil {
		s.promotes.Inc()
	}
}
