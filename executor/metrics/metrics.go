// Package metrics holds the executor's Prometheus metrics, flyte_executor_*. An executor
// registers them with the registry it is given (controller-runtime's, which its metrics
// endpoint serves beside controller_runtime_*, workqueue_* and rest_client_*). A nil
// *Metrics records nothing, for tests that do not look.
package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// Retry kinds.
const (
	RetryUser      = "user"
	RetrySystem    = "system"
	RetryTransient = "transient"
	// WaitResources is the backoff kind of waits for a quota or a cache reservation.
	WaitResources = "resources"
)

// phaseNames are the phases of a TaskAction, as in its status.
var phaseNames = []flytev1.Phase{flytev1.PhaseQueued, flytev1.PhaseWaitingForResources, flytev1.PhaseInitializing,
	flytev1.PhaseRunning, flytev1.PhaseSucceeded, flytev1.PhaseFailed, flytev1.PhaseAborted, flytev1.PhaseTimedOut}

// Metrics are the executor's instruments.
type Metrics struct {
	phaseChanges        *prometheus.CounterVec
	reconcileDuration   *prometheus.HistogramVec
	retries             *prometheus.CounterVec
	backoff             *prometheus.HistogramVec
	cacheLookups        *prometheus.CounterVec
	cacheOutputsRefused *prometheus.CounterVec
	cachePuts           *prometheus.CounterVec
	outbox              prometheus.Gauge
	delivered           prometheus.Counter
	deliveryFailures    prometheus.Counter
	deliveryLag         prometheus.Histogram
	gcDeleted           prometheus.Counter
	gcUndelivered       prometheus.Gauge
	gcWalk              prometheus.Histogram
}

// New creates the instruments and registers them with reg, with the gauge of actions by
// phase, which counts the actions in actions (the manager's informer cache) when scraped.
func New(reg prometheus.Registerer, actions client.Reader) (*Metrics, error) {
	m := &Metrics{
		phaseChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_executor_phase_changes_total",
			Help: "Phase changes the executor recorded, by the phase entered.",
		}, []string{"phase"}),
		reconcileDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "flyte_executor_reconcile_duration_seconds",
			Help:    "Time one reconcile of one TaskAction took, by result (success, requeue, error).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_executor_retries_total",
			Help: "Steps tried again, by kind: user (a new attempt on spec.retries), system (a new attempt, or the same step again, on maxSystemFailures), transient (the same step after an API or service error, on no budget).",
		}, []string{"kind"}),
		backoff: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "flyte_executor_backoff_seconds",
			Help:    "Waits scheduled before an action goes on, by kind: user and system (between attempts), resources (a quota or the cache reservation of an identical action).",
			Buckets: []float64{.1, .5, 1, 2, 5, 10, 30, 60, 120, 300},
		}, []string{"kind"}),
		cacheLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_executor_cache_lookups_total",
			Help: "Cache lookups before an action runs, by result: hit, miss, wait (an identical action holds the reservation), skipped (the cache could not be consulted).",
		}, []string{"result"}),
		cacheOutputsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_executor_cache_outputs_refused_total",
			Help: "Cache hits treated as misses because their outputs lay where the action may not read, by reason: outside (the allowed storage prefixes), other_project (another project's or domain's part), symlink (a symbolic link leading out). Any is a sign of a forged cache entry.",
		}, []string{"reason"}),
		cachePuts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flyte_executor_cache_puts_total",
			Help: "Outputs offered to the cache after a success, by the cache status that resulted.",
		}, []string{"status"}),
		outbox: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flyte_executor_events_outbox_actions",
			Help: "Actions with phase changes not yet delivered to the events service.",
		}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_executor_events_delivered_total",
			Help: "Action events the events service acknowledged.",
		}),
		deliveryFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_executor_events_delivery_failures_total",
			Help: "Record calls that failed and will be retried.",
		}),
		deliveryLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flyte_executor_events_delivery_lag_seconds",
			Help:    "Time from a phase change to the events service acknowledging its event.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		gcDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_executor_gc_deleted_total",
			Help: "Finished actions the garbage collector deleted.",
		}),
		gcUndelivered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flyte_executor_gc_kept_undelivered_actions",
			Help: "Finished actions old enough to collect that the last collection kept, their history not yet delivered to the events service.",
		}),
		gcWalk: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flyte_executor_gc_walk_seconds",
			Help:    "Time one collection took to walk the cached actions.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
		}),
	}
	// Every known label value starts at zero, so a series is there before its first event.
	for _, p := range phaseNames {
		m.phaseChanges.WithLabelValues(string(p))
	}
	for _, r := range []string{"success", "requeue", "error"} {
		m.reconcileDuration.WithLabelValues(r)
	}
	for _, k := range []string{RetryUser, RetrySystem, RetryTransient} {
		m.retries.WithLabelValues(k)
	}
	for _, k := range []string{RetryUser, RetrySystem, WaitResources} {
		m.backoff.WithLabelValues(k)
	}
	for _, r := range []string{"hit", "miss", "wait", "skipped"} {
		m.cacheLookups.WithLabelValues(r)
	}
	for _, r := range []string{"outside", "other_project", "symlink"} { // datastore.Reason*
		m.cacheOutputsRefused.WithLabelValues(r)
	}
	byPhase := &actionsByPhase{reader: actions, desc: prometheus.NewDesc("flyte_executor_actions",
		"TaskActions in the executor's informer cache, by phase (finished ones until they are deleted).", []string{"phase"}, nil)}
	for _, c := range []prometheus.Collector{m.phaseChanges, m.reconcileDuration, m.retries, m.backoff, m.cacheLookups,
		m.cacheOutputsRefused, m.cachePuts, m.outbox, m.delivered, m.deliveryFailures, m.deliveryLag,
		m.gcDeleted, m.gcUndelivered, m.gcWalk, byPhase} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the executor's metrics: %w", err)
		}
	}
	return m, nil
}

// actionsByPhase counts the cached actions by phase when scraped: nothing to keep in
// step on every reconcile, and never wrong after a restart or a missed deletion.
type actionsByPhase struct {
	reader client.Reader
	desc   *prometheus.Desc
}

func (c *actionsByPhase) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *actionsByPhase) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var list flytev1.TaskActionList
	if err := c.reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, fmt.Errorf("listing cached actions: %w", err))
		return
	}
	counts := make(map[flytev1.Phase]int, len(phaseNames))
	for i := range list.Items {
		p := list.Items[i].Status.Phase
		if p == "" {
			p = flytev1.PhaseQueued // not yet reconciled
		}
		counts[p]++
	}
	for _, p := range phaseNames {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[p]), string(p))
	}
}

// PhaseChanged counts a phase entered.
func (m *Metrics) PhaseChanged(phase string) {
	if m != nil {
		m.phaseChanges.WithLabelValues(phase).Inc()
	}
}

// Reconciled records one reconcile's duration and result.
func (m *Metrics) Reconciled(d time.Duration, result string) {
	if m != nil {
		m.reconcileDuration.WithLabelValues(result).Observe(d.Seconds())
	}
}

// Retried counts a retry of a kind.
func (m *Metrics) Retried(kind string) {
	if m != nil {
		m.retries.WithLabelValues(kind).Inc()
	}
}

// BackedOff records a scheduled wait.
func (m *Metrics) BackedOff(kind string, d time.Duration) {
	if m != nil {
		m.backoff.WithLabelValues(kind).Observe(d.Seconds())
	}
}

// CacheLookedUp counts a cache lookup result.
func (m *Metrics) CacheLookedUp(result string) {
	if m != nil {
		m.cacheLookups.WithLabelValues(result).Inc()
	}
}

// CacheOutputsRefused counts a cache hit refused for where its outputs lay.
func (m *Metrics) CacheOutputsRefused(reason string) {
	if m != nil {
		m.cacheOutputsRefused.WithLabelValues(reason).Inc()
	}
}

// CachePut counts outputs offered to the cache.
func (m *Metrics) CachePut(status string) {
	if m != nil {
		m.cachePuts.WithLabelValues(status).Inc()
	}
}

// Outbox sets how many actions wait for delivery.
func (m *Metrics) Outbox(n int) {
	if m != nil {
		m.outbox.Set(float64(n))
	}
}

// Delivered records events acknowledged, with the time each waited since it happened.
func (m *Metrics) Delivered(lags []time.Duration) {
	if m == nil {
		return
	}
	m.delivered.Add(float64(len(lags)))
	for _, l := range lags {
		m.deliveryLag.Observe(max(l, 0).Seconds())
	}
}

// DeliveryFailed counts a failed Record call.
func (m *Metrics) DeliveryFailed() {
	if m != nil {
		m.deliveryFailures.Inc()
	}
}

// Collected records one garbage collection: its walk over the cache, the actions it
// deleted and those it kept for want of delivery.
func (m *Metrics) Collected(walk time.Duration, deleted, undelivered int) {
	if m == nil {
		return
	}
	m.gcWalk.Observe(walk.Seconds())
	m.gcDeleted.Add(float64(deleted))
	m.gcUndelivered.Set(float64(undelivered))
}
