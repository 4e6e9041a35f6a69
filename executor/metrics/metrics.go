// Package metrics holds the executor's Prometheus metrics, flyte_executor_*. An executor
// registers them with the registry it is given (controller-runtime's, which its metrics
// endpoint serves beside controller_runtime_*, workqueue_* and rest_client_*). A nil
// *Metrics records nothing, for tests that do not look.
package metrics

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/internal/buildinfo"
	"github.com/flytekube/backend/internal/instrument"
)

// Retry kinds.
const (
	RetryUser      = "user"
	RetrySystem    = "system"
	RetryTransient = "transient"
	// WaitResources is the backoff kind of waits for a quota or a cache reservation.
	WaitResources = "resources"
)

// Metrics are the executor's instruments.
type Metrics struct {
	phaseChanges        *prometheus.CounterVec
	reconcileDuration   *prometheus.HistogramVec
	retries             *prometheus.CounterVec
	backoff             *prometheus.HistogramVec
	cacheLookups        *prometheus.CounterVec
	cacheOutputsRefused *prometheus.CounterVec
	cachePuts           *prometheus.CounterVec
	cacheReleases       *prometheus.CounterVec
	undelivered         prometheus.Gauge
	delivered           prometheus.Counter
	deliveryFailures    prometheus.Counter
	deliveryLag         prometheus.Histogram
	refused             prometheus.Counter
	refusals            *prometheus.CounterVec
	refusedActions      prometheus.Gauge
	gcDeleted           prometheus.Counter
	gcUndelivered       prometheus.Gauge
	gcFinished          prometheus.Gauge
	gcWalk              prometheus.Histogram
	gcRefused           *prometheus.CounterVec
	gcUndeletable       prometheus.Gauge
	backlogHeld         prometheus.Gauge
	backlogUndelivered  prometheus.Gauge
	backlogBound        prometheus.Gauge
}

// New creates the instruments and registers them with reg, with the gauge of actions by
// phase, which counts the actions in actions (the manager's informer cache) when scraped;
// a nil actions leaves that gauge out (tests of one component, which have no cache).
func New(reg prometheus.Registerer, actions client.Reader) (*Metrics, error) {
	phases := make([]string, len(flytev1.Phases()))
	for i, p := range flytev1.Phases() {
		phases[i] = string(p)
	}
	m := &Metrics{
		phaseChanges: instrument.CounterVec("flyte_executor_phase_changes_total",
			"Phase changes the executor recorded, by the phase entered.", "phase", phases...),
		reconcileDuration: instrument.HistogramVec("flyte_executor_reconcile_duration_seconds",
			"Time one reconcile of one TaskAction took, by result (success, requeue, error).",
			[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, "result", "success", "requeue", "error"),
		retries: instrument.CounterVec("flyte_executor_retries_total",
			"Steps tried again, by kind: user (a new attempt on spec.retries), system (a new attempt, or the same step again, on maxSystemFailures), transient (the same step after an API or service error, on no budget).",
			"kind", RetryUser, RetrySystem, RetryTransient),
		backoff: instrument.HistogramVec("flyte_executor_backoff_seconds",
			"Waits scheduled before an action goes on, by kind: user and system (between attempts), resources (a quota or the cache reservation of an identical action).",
			[]float64{.1, .5, 1, 2, 5, 10, 30, 60, 120, 300}, "kind", RetryUser, RetrySystem, WaitResources),
		cacheLookups: instrument.CounterVec("flyte_executor_cache_lookups_total",
			"Cache lookups before an action runs, by result: hit, miss, wait (an identical action holds the reservation), skipped (the cache could not be consulted), overwrite (spec.cache.overwrite: not read), stale (a hit whose outputs are gone: run and overwritten).",
			"result", "hit", "miss", "wait", "skipped", "overwrite", "stale"),
		cacheOutputsRefused: instrument.CounterVec("flyte_executor_cache_outputs_refused_total",
			"Cache hits treated as misses because their outputs lay where the action may not read, by reason: outside (the allowed storage prefixes), other_project (another project's or domain's part), symlink (a symbolic link leading out). Any is a sign of a forged cache entry.",
			"reason", "outside", "other_project", "symlink"), // storage.Reason*
		cachePuts: instrument.CounterVec("flyte_executor_cache_puts_total",
			"Outputs offered to the cache after a success, by the cache status that resulted.", "status"),
		cacheReleases: instrument.CounterVec("flyte_executor_cache_releases_total",
			"Reservations of deleted actions given back to the cache service in the background, by result: released, failed (on every try) or dropped (too many queued, or the executor stopped first). A reservation not released expires by itself a few heartbeat intervals later.",
			"result", "released", "failed", "dropped"),
		undelivered: instrument.Gauge("flyte_executor_events_undelivered_actions",
			"Actions with phase changes not yet delivered to the events service."),
		delivered: instrument.Counter("flyte_executor_events_delivered_total",
			"Action events the events service acknowledged."),
		deliveryFailures: instrument.Counter("flyte_executor_events_delivery_failures_total",
			"Record calls that failed and will be retried."),
		deliveryLag: instrument.Histogram("flyte_executor_events_delivery_lag_seconds",
			"Time from a phase change to the events service acknowledging its event.",
			[]float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}),
		refused: instrument.Counter("flyte_executor_events_refused_total",
			"Action events the events service refused on every try of eventsDelivery.maxRefusals, then given up on so that their action could go; they stay in the action's status, and a Kubernetes Event (EventsRefused) names them. Never, unless an operator set that limit."),
		refusals: instrument.CounterVec("flyte_executor_events_refusals_total",
			"Offers of an action's events the events service refused, by code: invalid_argument (an events service older than the executor refuses what it does not know, or the events are invalid), resource_exhausted (an event too large for the service even alone). The events are held and offered again with a backoff.",
			"code", connect.CodeInvalidArgument.String(), connect.CodeResourceExhausted.String()),
		refusedActions: instrument.Gauge("flyte_executor_events_refused_actions",
			"Actions whose events the events service refused at their last offer: held, undelivered (the collector keeps them; finished ones count toward eventsBacklog.maxUndeliveredFinished) and offered again with a backoff of up to 5 minutes; the leader's count."),
		gcDeleted: instrument.Counter("flyte_executor_gc_deleted_total",
			"Finished actions the garbage collector deleted."),
		gcUndelivered: instrument.Gauge("flyte_executor_gc_kept_undelivered_actions",
			"Finished actions old enough to collect that the last collection kept, their history not yet delivered to the events service."),
		gcFinished: instrument.Gauge("flyte_executor_gc_finished_actions",
			"Finished actions held in the API server at the last collection, before it deleted any (bounded by gc.maxFinished)."),
		gcWalk: instrument.Histogram("flyte_executor_gc_walk_seconds",
			"Time one collection took to walk the cached actions.",
			[]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5}),
		gcRefused: instrument.CounterVec("flyte_executor_gc_delete_refusals_total",
			"Deletes of finished actions the API server refused (a webhook, an admission policy, RBAC), by reason: forbidden (403), invalid (422), bad_request (400), internal (500, as a failing webhook), other. The collector skips such an action, collects the others and tries it again later.",
			"reason", "forbidden", "invalid", "bad_request", "internal", "other"),
		gcUndeletable: instrument.Gauge("flyte_executor_gc_undeletable_actions",
			"Finished actions whose last delete the API server refused, as of the last collection; they are tried again after a backoff and do not count against gc.maxFinished."),
		backlogHeld: instrument.Gauge("flyte_executor_events_backlog_held_actions",
			"New actions that wait (Queued, reason EventsBacklog) because the finished actions whose history is not yet delivered reached eventsBacklog.maxUndeliveredFinished; the leader's count."),
		backlogUndelivered: instrument.Gauge("flyte_executor_events_backlog_finished_undelivered_actions",
			"Finished actions stored whose history is not yet delivered to the events service: what eventsBacklog.maxUndeliveredFinished bounds; the leader's count."),
		backlogBound: instrument.Gauge("flyte_executor_events_backlog_max_finished_undelivered",
			"eventsBacklog.maxUndeliveredFinished: past it, new actions wait."),
	}
	collectors := []prometheus.Collector{m.phaseChanges, m.reconcileDuration, m.retries, m.backoff, m.cacheLookups,
		m.cacheOutputsRefused, m.cachePuts, m.cacheReleases, m.undelivered, m.delivered, m.deliveryFailures, m.deliveryLag, m.refused,
		m.refusals, m.refusedActions,
		m.gcDeleted, m.gcUndelivered, m.gcFinished, m.gcWalk, m.gcRefused, m.gcUndeletable, m.backlogHeld, m.backlogUndelivered, m.backlogBound}
	collectors = append(collectors, buildinfo.Metric("flyte_executor_build_info"))
	if actions != nil {
		collectors = append(collectors, &actionsByPhase{reader: actions, desc: prometheus.NewDesc("flyte_executor_actions",
			"TaskActions in the executor's informer cache, by phase (finished ones until they are deleted).", []string{"phase"}, nil)})
	}
	if err := instrument.Register(reg, collectors...); err != nil {
		return nil, fmt.Errorf("registering the executor's metrics: %w", err)
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
	counts := make(map[flytev1.Phase]int, len(flytev1.Phases()))
	for i := range list.Items {
		p := list.Items[i].Status.Phase
		if p == "" {
			p = flytev1.PhaseQueued // not yet reconciled
		}
		counts[p]++
	}
	for _, p := range flytev1.Phases() {
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

// CacheReleased counts a gone action's reservation given back, or not, by result.
func (m *Metrics) CacheReleased(result string) {
	if m != nil {
		m.cacheReleases.WithLabelValues(result).Inc()
	}
}

// Undelivered sets how many actions wait for delivery.
func (m *Metrics) Undelivered(n int) {
	if m != nil {
		m.undelivered.Set(float64(n))
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

// EventsRefused counts events the events service refused for good.
func (m *Metrics) EventsRefused(n int) {
	if m != nil {
		m.refused.Add(float64(n))
	}
}

// EventsRefusal counts one refused offer of an action's events, by the answer's code.
func (m *Metrics) EventsRefusal(code connect.Code) {
	if m != nil {
		m.refusals.WithLabelValues(code.String()).Inc()
	}
}

// RefusedActions sets how many actions' events are held after a refusal.
func (m *Metrics) RefusedActions(n int) {
	if m != nil {
		m.refusedActions.Set(float64(n))
	}
}

// DeliveryFailed counts a failed Record call.
func (m *Metrics) DeliveryFailed() {
	if m != nil {
		m.deliveryFailures.Inc()
	}
}

// Collected records one garbage collection: its walk over the cache, the finished
// actions it found, those it deleted and those it kept for want of delivery.
func (m *Metrics) Collected(walk time.Duration, finished, deleted, undelivered int) {
	if m == nil {
		return
	}
	m.gcFinished.Set(float64(finished))
	m.gcWalk.Observe(walk.Seconds())
	m.gcDeleted.Add(float64(deleted))
	m.gcUndelivered.Set(float64(undelivered))
}

// DeleteRefused counts a delete of a finished action that the API server refused.
func (m *Metrics) DeleteRefused(reason string) {
	if m != nil {
		m.gcRefused.WithLabelValues(reason).Inc()
	}
}

// Undeletable sets how many finished actions the collector holds as refused.
func (m *Metrics) Undeletable(n int) {
	if m != nil {
		m.gcUndeletable.Set(float64(n))
	}
}

// EventsBacklog records the finished actions whose history waits for the events
// service, against their bound, and the new actions held for them.
func (m *Metrics) EventsBacklog(undelivered, held, bound int) {
	if m == nil {
		return
	}
	m.backlogUndelivered.Set(float64(undelivered))
	m.backlogHeld.Set(float64(held))
	m.backlogBound.Set(float64(bound))
}
