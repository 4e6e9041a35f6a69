// Package metrics holds the executor's Prometheus metrics, flyte_executor_*. They live in
// controller-runtime's registry, beside its own (controller_runtime_*, workqueue_*,
// rest_client_*) and the cache and events clients' RPC metrics, and are served on the
// executor's metrics endpoint. They are process-wide, as controller-runtime's are.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// Actions counts the actions this executor has seen, by phase.
	actions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "flyte_executor_actions",
		Help: "TaskActions known to the executor, by phase (terminal ones until they are deleted).",
	}, []string{"phase"})
	phaseChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flyte_executor_phase_changes_total",
		Help: "Phase changes the executor recorded, by the phase entered.",
	}, []string{"phase"})
	reconcileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "flyte_executor_reconcile_duration_seconds",
		Help:    "Time one reconcile of one TaskAction took, by result (success, requeue, error).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"result"})
	retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flyte_executor_retries_total",
		Help: "Steps tried again, by kind: user (a new attempt on spec.retries), system (a new attempt, or the same step again, on maxSystemFailures), transient (the same step after an API or service error, on no budget).",
	}, []string{"kind"})
	backoff = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "flyte_executor_backoff_seconds",
		Help:    "Waits scheduled before an action goes on, by kind: user and system (between attempts), resources (a quota or the cache reservation of an identical action).",
		Buckets: []float64{.1, .5, 1, 2, 5, 10, 30, 60, 120, 300},
	}, []string{"kind"})
	cacheLookups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flyte_executor_cache_lookups_total",
		Help: "Cache lookups before an action runs, by result: hit, miss, wait (an identical action holds the reservation), skipped (the cache could not be consulted).",
	}, []string{"result"})
	cacheOutputsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flyte_executor_cache_outputs_refused_total",
		Help: "Cache hits treated as misses because their outputs lay where the action may not read, by reason: outside (the allowed storage prefixes), other_project (another project's or domain's part), symlink (a symbolic link leading out). Any is a sign of a forged cache entry.",
	}, []string{"reason"})
	cachePuts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flyte_executor_cache_puts_total",
		Help: "Outputs offered to the cache after a success, by the cache status that resulted.",
	}, []string{"status"})
	outbox = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flyte_executor_events_outbox_actions",
		Help: "Actions with phase changes not yet delivered to the events service.",
	})
	delivered = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flyte_executor_events_delivered_total",
		Help: "Action events the events service acknowledged.",
	})
	deliveryFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flyte_executor_events_delivery_failures_total",
		Help: "Record calls that failed and will be retried.",
	})
	deliveryLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "flyte_executor_events_delivery_lag_seconds",
		Help:    "Time from a phase change to the events service acknowledging its event.",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	})
)

// phaseNames are the phases of a TaskAction, as in its status.
var phaseNames = []string{"Queued", "WaitingForResources", "Initializing", "Running", "Succeeded", "Failed", "Aborted", "TimedOut"}

func init() {
	// Every known label value starts at zero, so a series is there before its first event.
	for _, p := range phaseNames {
		actions.WithLabelValues(p)
		phaseChanges.WithLabelValues(p)
	}
	for _, r := range []string{"success", "requeue", "error"} {
		reconcileDuration.WithLabelValues(r)
	}
	for _, k := range []string{RetryUser, RetrySystem, RetryTransient} {
		retries.WithLabelValues(k)
	}
	for _, k := range []string{RetryUser, RetrySystem, WaitResources} {
		backoff.WithLabelValues(k)
	}
	for _, r := range []string{"hit", "miss", "wait", "skipped"} {
		cacheLookups.WithLabelValues(r)
	}
	for _, r := range []string{"outside", "other_project", "symlink"} { // datastore.Reason*
		cacheOutputsRefused.WithLabelValues(r)
	}
	ctrlmetrics.Registry.MustRegister(actions, phaseChanges, reconcileDuration, retries, backoff,
		cacheLookups, cacheOutputsRefused, cachePuts, outbox, delivered, deliveryFailures, deliveryLag)
}

// Retry kinds.
const (
	RetryUser      = "user"
	RetrySystem    = "system"
	RetryTransient = "transient"
	// WaitResources is the backoff kind of waits for a quota or a cache reservation.
	WaitResources = "resources"
)

// phases remembers each action's phase for the actions gauge.
var phases = struct {
	sync.Mutex
	m map[types.NamespacedName]string
}{m: map[types.NamespacedName]string{}}

// ObservePhase records an action's current phase; a change moves it in the gauge.
func ObservePhase(action types.NamespacedName, phase string) {
	phases.Lock()
	defer phases.Unlock()
	old, known := phases.m[action]
	if known && old == phase {
		return
	}
	if known {
		actions.WithLabelValues(old).Dec()
	}
	phases.m[action] = phase
	actions.WithLabelValues(phase).Inc()
}

// ForgetAction drops a deleted action from the gauge.
func ForgetAction(action types.NamespacedName) {
	phases.Lock()
	defer phases.Unlock()
	if old, known := phases.m[action]; known {
		actions.WithLabelValues(old).Dec()
		delete(phases.m, action)
	}
}

// PhaseChanged counts a phase entered.
func PhaseChanged(phase string) { phaseChanges.WithLabelValues(phase).Inc() }

// Reconciled records one reconcile's duration and result.
func Reconciled(d time.Duration, result string) {
	reconcileDuration.WithLabelValues(result).Observe(d.Seconds())
}

// Retried counts a retry of a kind.
func Retried(kind string) { retries.WithLabelValues(kind).Inc() }

// BackedOff records a scheduled wait.
func BackedOff(kind string, d time.Duration) { backoff.WithLabelValues(kind).Observe(d.Seconds()) }

// CacheLookedUp counts a cache lookup result.
func CacheLookedUp(result string) { cacheLookups.WithLabelValues(result).Inc() }

// CacheOutputsRefused counts a cache hit refused for where its outputs lay.
func CacheOutputsRefused(reason string) { cacheOutputsRefused.WithLabelValues(reason).Inc() }

// CachePut counts outputs offered to the cache.
func CachePut(status string) { cachePuts.WithLabelValues(status).Inc() }

// Outbox sets how many actions wait for delivery.
func Outbox(n int) { outbox.Set(float64(n)) }

// Delivered records events acknowledged, with the time each waited since it happened.
func Delivered(lags []time.Duration) {
	delivered.Add(float64(len(lags)))
	for _, l := range lags {
		deliveryLag.Observe(max(l, 0).Seconds())
	}
}

// DeliveryFailed counts a failed Record call.
func DeliveryFailed() { deliveryFailures.Inc() }
