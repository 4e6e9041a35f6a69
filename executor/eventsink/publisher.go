// Package eventsink delivers TaskAction phase changes to the events service.
//
// The outbox is the action's own phase history, which the reconciler writes anyway: no
// extra API write is spent on events. The publisher keeps in memory how far each action
// has been delivered, batches the undelivered entries of many actions into one Record
// call, and retries with backoff while the events service is away, without holding up
// the actions themselves. The garbage collector deletes a finished action only once
// Delivered says its whole history is recorded. After a restart the publisher knows
// nothing, so the reconciler hands it every finished action again and their histories go
// once more; the events service absorbs the repeats. Delivery is at least once, in order
// per action.
package eventsink

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/tracing"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/backoff"
	"github.com/flytekube/backend/internal/rpcclient"
)

// maxBatch is the events service's limit per Record.
const maxBatch = 1000

// maxLinks bounds the links of a delivery span to actions' traces (the SDK's default
// limit: more would be dropped anyway).
const maxLinks = 128

// Attributes of a delivery span.
const (
	eventsAttr  = attribute.Key("flyte.events")
	actionsAttr = attribute.Key("flyte.actions")
)

// Publisher delivers phase changes. It is a manager runnable; Enqueue is called by the
// reconciler after it wrote new history.
type Publisher struct {
	client  eventsv1connect.EventsServiceClient
	cluster string
	clock   clock.PassiveClock
	log     *slog.Logger
	tracer  trace.Tracer
	metrics *metrics.Metrics
	// onDelivered, when set, hears of each finished action whose whole history has been
	// delivered.
	onDelivered func(*flytev1.TaskAction)

	queue workqueue.TypedRateLimitingInterface[types.UID]
	// deleted wakes the reconciler for a deleted action once its history (its Aborted
	// entry included) has been delivered, so that it can let the action go.
	deleted chan event.TypedGenericEvent[*flytev1.TaskAction]

	mu sync.Mutex
	// states is keyed by UID, so that an action deleted and created again under the same
	// name keeps the undelivered history of its first incarnation apart.
	states map[types.UID]*state
	names  map[types.NamespacedName]types.UID
}

// state is everything the publisher knows of one action: the one place that says how
// far its history has been delivered.
type state struct {
	key types.NamespacedName
	// pending is the newest state the reconciler wrote, kept until all of its history is
	// delivered: the informer cache may not have it yet, and the action may be deleted
	// meanwhile. Nil when nothing is left to deliver.
	pending *flytev1.TaskAction
	// delivered is the last entry the events service acknowledged; known is false until
	// one was, and after a restart, so that the whole history goes again.
	delivered mark
	known     bool
	// gone: the action was deleted; the state goes once pending is delivered.
	gone bool
	// wake, when set, is the deleted action to wake the reconciler for once pending is
	// delivered (ReleaseWhenDelivered).
	wake *flytev1.TaskAction
}

// mark identifies a history entry.
type mark struct{ attempt, version int32 }

func (m mark) less(o mark) bool {
	return m.attempt < o.attempt || m.attempt == o.attempt && m.version < o.version
}

// Option changes a publisher.
type Option func(*Publisher)

// WithTracerProvider sends the delivery spans to tp instead of the global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(p *Publisher) { p.tracer = tp.Tracer(tracing.ScopeName) }
}

// WithMetrics records deliveries in m.
func WithMetrics(m *metrics.Metrics) Option {
	return func(p *Publisher) { p.metrics = m }
}

// OnDelivered calls f (from the delivering goroutine) with each finished action whose
// whole history the events service acknowledged; benchmarks time actions by it.
func OnDelivered(f func(*flytev1.TaskAction)) Option {
	return func(p *Publisher) { p.onDelivered = f }
}

// New creates a publisher.
func New(c eventsv1connect.EventsServiceClient, cluster string, clk clock.PassiveClock, log *slog.Logger, opts ...Option) *Publisher {
	p := &Publisher{
		client: c, cluster: cluster, clock: clk, log: log, tracer: otel.Tracer(tracing.ScopeName),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig[types.UID](
			// Jittered, so that the actions of one failed batch do not retry as one batch
			// again at the same instant, and neither do several executors.
			backoff.NewLimiter[types.UID](backoff.Backoff{Base: 100 * time.Millisecond, Cap: 30 * time.Second}),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "events"}),
		deleted: make(chan event.TypedGenericEvent[*flytev1.TaskAction], 1024),
		states:  make(map[types.UID]*state),
		names:   make(map[types.NamespacedName]types.UID),
	}
	for _, opt := range opts {
		opt(p)
	}
	return p
}

func keyOf(ta *flytev1.TaskAction) types.NamespacedName {
	return types.NamespacedName{Namespace: ta.Namespace, Name: ta.Name}
}

// stateOf returns ta's state, new if unknown. The caller holds p.mu.
func (p *Publisher) stateOf(ta *flytev1.TaskAction) *state {
	st := p.states[ta.UID]
	if st == nil {
		st = &state{key: keyOf(ta)}
		p.states[ta.UID] = st
		p.names[st.key] = ta.UID
	}
	return st
}

// Enqueue hands over ta as the reconciler just wrote it (or, after a restart, as it
// found it) to have its undelivered history delivered. Handing over what is already
// delivered or already waiting does nothing.
func (p *Publisher) Enqueue(ta *flytev1.TaskAction) {
	end, ok := last(ta)
	if !ok {
		return
	}
	p.mu.Lock()
	added := p.enqueueLocked(p.stateOf(ta), ta, end)
	p.mu.Unlock()
	if added {
		p.queued(ta.UID)
	}
}

// ReleaseWhenDelivered reports whether all of a deleted action's history has been
// delivered, so that its finalizer may come off. If not, it hands ta over and the
// reconciler is woken (Source) once it is. The check and the request to be woken are
// one step: a delivery finishing in between cannot slip past, whichever snapshot it
// delivered.
func (p *Publisher) ReleaseWhenDelivered(ta *flytev1.TaskAction) bool {
	end, ok := last(ta)
	if !ok {
		return true
	}
	p.mu.Lock()
	st := p.stateOf(ta)
	if st.known && !st.delivered.less(end) {
		p.mu.Unlock()
		return true
	}
	st.wake = ta.DeepCopy()
	added := p.enqueueLocked(st, ta, end)
	p.mu.Unlock()
	if added {
		p.queued(ta.UID)
	}
	return false
}

// enqueueLocked makes ta the state's pending snapshot unless what is delivered or
// waiting already reaches end, and reports whether it did. The caller holds p.mu.
func (p *Publisher) enqueueLocked(st *state, ta *flytev1.TaskAction, end mark) bool {
	if st.known && !st.delivered.less(end) {
		return false
	}
	if st.pending != nil {
		if have, _ := last(st.pending); !have.less(end) {
			return false
		}
	}
	st.pending = ta.DeepCopy()
	return true
}

func (p *Publisher) queued(uid types.UID) {
	p.queue.Add(uid)
	p.metrics.Outbox(p.queue.Len())
}

// Source wakes the reconciler for deleted actions whose history has been delivered, so
// that it can remove their finalizer.
func (p *Publisher) Source() source.Source {
	return source.Channel(p.deleted, &handler.TypedEnqueueRequestForObject[*flytev1.TaskAction]{})
}

func last(ta *flytev1.TaskAction) (mark, bool) {
	h := ta.Status.PhaseHistory
	if len(h) == 0 {
		return mark{}, false
	}
	return mark{h[len(h)-1].Attempt, h[len(h)-1].Version}, true
}

// Delivered reports whether every history entry of ta has been delivered. After a
// restart nothing is, until the reconciler hands the action over again.
func (p *Publisher) Delivered(ta *flytev1.TaskAction) bool {
	end, ok := last(ta)
	if !ok {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.states[ta.UID]
	return st != nil && st.known && !st.delivered.less(end)
}

// Forget is told that an action is gone. What it had not yet delivered still is; then
// its state goes.
func (p *Publisher) Forget(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	uid, ok := p.names[key]
	if !ok {
		return
	}
	delete(p.names, key)
	if st := p.states[uid]; st.pending == nil {
		delete(p.states, uid)
	} else {
		st.gone = true
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: the leader delivers
// what its reconciles produced.
func (p *Publisher) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it delivers until ctx ends.
func (p *Publisher) Start(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		p.queue.ShutDown()
	}()
	for {
		uids, ok := p.next()
		if !ok {
			return nil
		}
		p.deliver(ctx, uids)
		p.metrics.Outbox(p.queue.Len())
	}
}

// next blocks for one action, then takes whatever else is already queued: one Record
// carries many actions' events.
func (p *Publisher) next() ([]types.UID, bool) {
	uid, shutdown := p.queue.Get()
	if shutdown {
		return nil, false
	}
	uids := []types.UID{uid}
	for len(uids) < maxBatch && p.queue.Len() > 0 {
		u, shutdown := p.queue.Get()
		if shutdown {
			break
		}
		uids = append(uids, u)
	}
	return uids, true
}

// pending is one action's part of a delivery.
type pending struct {
	uid    types.UID
	action *flytev1.TaskAction // the snapshot delivered from
	events []*eventsv1.ActionEvent
	end    mark // the last entry in events
	more   bool // entries after end remain
}

func (p *Publisher) deliver(ctx context.Context, uids []types.UID) {
	var work []pending
	for _, uid := range uids {
		ta, evs, end, more := p.undelivered(uid)
		if len(evs) == 0 {
			p.queue.Forget(uid)
			p.queue.Done(uid)
			if ta != nil { // delivered meanwhile, under an older snapshot
				p.acknowledged(ctx, pending{uid: uid, action: ta, end: end})
			}
			continue
		}
		work = append(work, pending{uid: uid, action: ta, events: evs, end: end, more: more})
	}
	// One Record per batch of up to maxBatch events; an action's events stay together
	// and in order.
	for len(work) > 0 {
		var batch []*eventsv1.ActionEvent
		n := 0
		for n < len(work) && (n == 0 || len(batch)+len(work[n].events) <= maxBatch) {
			batch = append(batch, work[n].events...)
			n++
		}
		part := work[:n]
		work = work[n:]
		err := p.record(ctx, part, batch)
		if connect.CodeOf(err) == connect.CodeInvalidArgument && len(part) > 1 {
			// One action's bad event must not hold the others back: each goes alone,
			// and only the bad one waits.
			for _, w := range part {
				p.settle(ctx, []pending{w}, w.events, p.record(ctx, []pending{w}, w.events))
			}
			continue
		}
		p.settle(ctx, part, batch, err)
	}
}

// record sends one batch of events.
func (p *Publisher) record(ctx context.Context, part []pending, batch []*eventsv1.ActionEvent) error {
	rctx, span := p.startDelivery(ctx, part, len(batch))
	_, err := p.client.Record(rctx, connect.NewRequest(&eventsv1.RecordRequest{Events: batch}))
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// settle records the outcome of a Record for the actions it carried: delivered ones move
// on; the others are retried after a backoff.
func (p *Publisher) settle(ctx context.Context, part []pending, batch []*eventsv1.ActionEvent, err error) {
	if err != nil {
		p.metrics.DeliveryFailed()
	} else {
		now := p.clock.Now()
		lags := make([]time.Duration, len(batch))
		for i, ev := range batch {
			lags[i] = now.Sub(ev.GetOccurredAt().AsTime())
		}
		p.metrics.Delivered(lags)
	}
	for _, w := range part {
		if err != nil {
			p.queue.AddRateLimited(w.uid)
			p.queue.Done(w.uid)
			continue
		}
		p.queue.Forget(w.uid)
		p.queue.Done(w.uid)
		if p.acknowledged(ctx, w) {
			p.queue.Add(w.uid) // more entries, or newer ones written meanwhile
		}
	}
	switch {
	case err == nil || ctx.Err() != nil:
	case connect.CodeOf(err) == connect.CodeInvalidArgument:
		// Not the service's fault, and retrying will not help until the executor is
		// fixed; the events stay in the action's history, and it is not released.
		p.log.Error("events service refused an action's events; keeping them and retrying",
			"error", err, "action", keyOf(part[0].action).String(), "events", len(batch))
	default:
		p.log.Warn("events service unavailable; will retry", "error", err, "actions", len(part), "events", len(batch))
	}
}

// acknowledged moves an action's delivered mark to the end of what was just delivered,
// and reports whether more remains to deliver.
func (p *Publisher) acknowledged(ctx context.Context, w pending) bool {
	p.mu.Lock()
	st := p.states[w.uid]
	if st == nil { // cannot happen: states go only once nothing is pending
		p.mu.Unlock()
		return false
	}
	st.delivered, st.known = w.end, true
	if w.more || st.pending != w.action {
		p.mu.Unlock()
		return true
	}
	st.pending = nil
	wake := st.wake
	st.wake = nil
	if st.gone {
		delete(p.states, w.uid)
	}
	p.mu.Unlock()
	ta := w.action
	if ta.Status.Phase.IsTerminal() && p.onDelivered != nil {
		p.onDelivered(ta)
	}
	if wake == nil && ta.Status.Phase.IsTerminal() && !ta.DeletionTimestamp.IsZero() {
		wake = ta
	}
	if wake != nil {
		// The reconciler's source drains the channel continuously, so waiting here is
		// brief, and nothing is dropped: no periodic resync would find it soon.
		select {
		case p.deleted <- event.TypedGenericEvent[*flytev1.TaskAction]{Object: wake}:
		case <-ctx.Done():
		}
	}
	return false
}

// startDelivery starts the span of one Record call. A span has one parent, and a Record
// can carry many actions. A call for a single action (the common case unless actions
// finish in bursts) is part of that action's trace, so that the events service's handler
// and SQL spans show up in it; a call for several starts a trace of its own, linked to
// each action's trace (the links are cheap, and reachable from every action's trace).
func (p *Publisher) startDelivery(ctx context.Context, part []pending, events int) (context.Context, trace.Span) {
	var opts []trace.SpanStartOption
	if len(part) == 1 {
		ctx = tracing.ContextWithAction(ctx, part[0].action.UID)
	} else {
		opts = []trace.SpanStartOption{trace.WithNewRoot()}
	}
	ctx, span := p.tracer.Start(ctx, "events.Deliver", opts...)
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(eventsAttr.Int(events), actionsAttr.Int(len(part)))
	if len(part) == 1 {
		span.SetAttributes(tracing.ActionAttributes(part[0].action)...)
		return ctx, span
	}
	for _, w := range part[:min(len(part), maxLinks)] {
		span.AddLink(trace.Link{SpanContext: tracing.SpanContext(w.action.UID),
			Attributes: []attribute.KeyValue{tracing.Action.String(w.action.Spec.ActionName)}})
	}
	return ctx, span
}

// undelivered turns the history entries of an action's pending snapshot after its
// delivered mark into events, at most maxBatch of them; more says whether others remain.
func (p *Publisher) undelivered(uid types.UID) (ta *flytev1.TaskAction, evs []*eventsv1.ActionEvent, end mark, more bool) {
	p.mu.Lock()
	st := p.states[uid]
	if st == nil || st.pending == nil {
		p.mu.Unlock()
		return nil, nil, mark{}, false
	}
	ta, done, known := st.pending, st.delivered, st.known
	p.mu.Unlock()
	end = done
	now := timestamppb.New(p.clock.Now())
	for _, h := range ta.Status.PhaseHistory {
		m := mark{h.Attempt, h.Version}
		if known && !done.less(m) {
			continue
		}
		if len(evs) == maxBatch {
			return ta, evs, end, true
		}
		evs = append(evs, p.toEvent(ta, h, now))
		end = m
	}
	return ta, evs, end, false
}

var phases = map[flytev1.Phase]flytecorev1.ActionPhase{
	flytev1.PhaseQueued:              flytecorev1.ActionPhase_ACTION_PHASE_QUEUED,
	flytev1.PhaseWaitingForResources: flytecorev1.ActionPhase_ACTION_PHASE_WAITING_FOR_RESOURCES,
	flytev1.PhaseInitializing:        flytecorev1.ActionPhase_ACTION_PHASE_INITIALIZING,
	flytev1.PhaseRunning:             flytecorev1.ActionPhase_ACTION_PHASE_RUNNING,
	flytev1.PhaseSucceeded:           flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED,
	flytev1.PhaseFailed:              flytecorev1.ActionPhase_ACTION_PHASE_FAILED,
	flytev1.PhaseAborted:             flytecorev1.ActionPhase_ACTION_PHASE_ABORTED,
	flytev1.PhaseTimedOut:            flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT,
}

var cacheStatuses = map[flytev1.CacheStatus]flytecorev1.CacheStatus{
	flytev1.CacheDisabled: flytecorev1.CacheStatus_CACHE_STATUS_DISABLED, flytev1.CacheMiss: flytecorev1.CacheStatus_CACHE_STATUS_MISS,
	flytev1.CacheHit: flytecorev1.CacheStatus_CACHE_STATUS_HIT, flytev1.CachePopulated: flytecorev1.CacheStatus_CACHE_STATUS_POPULATED,
	flytev1.CachePutFailure: flytecorev1.CacheStatus_CACHE_STATUS_PUT_FAILURE, flytev1.CacheSkipped: flytecorev1.CacheStatus_CACHE_STATUS_SKIPPED,
}

// toEvent copies a history entry as it is: the reconciler fitted its text to the
// contract (fitText), and the CRD's limits are within the contract's.
func (p *Publisher) toEvent(ta *flytev1.TaskAction, h flytev1.PhaseTransition, reportedAt *timestamppb.Timestamp) *eventsv1.ActionEvent {
	ev := &eventsv1.ActionEvent{
		Id: &flytecorev1.ActionIdentifier{
			Project: ta.Spec.Project, Domain: ta.Spec.Domain, Run: ta.Spec.RunName, Action: ta.Spec.ActionName,
		},
		Attempt:     uint32(h.Attempt),
		Phase:       phases[h.Phase],
		Version:     uint32(h.Version),
		OccurredAt:  timestamppb.New(h.OccurredAt.Time),
		ReportedAt:  reportedAt,
		Cluster:     p.cluster,
		OutputsUri:  h.OutputsURI,
		CacheStatus: cacheStatuses[h.CacheStatus],
		Reason:      h.Reason,
		Message:     h.Message,
		TaskType:    ta.Spec.TaskType,
	}
	for _, l := range h.LogLinks {
		ev.LogLinks = append(ev.LogLinks, &eventsv1.LogLink{Name: l.Name, Uri: l.URI})
	}
	for _, e := range h.ClusterEvents {
		ev.ClusterEvents = append(ev.ClusterEvents, &eventsv1.ClusterEvent{OccurredAt: timestamppb.New(e.OccurredAt.Time),
			Object: e.Object, Type: e.Type, Reason: e.Reason, Message: e.Message, Count: uint32(max(e.Count, 0))})
	}
	if e := h.Error; e != nil {
		kind := flytecorev1.ExecutionError_KIND_USER
		if e.Kind == flytev1.ErrorKindSystem {
			kind = flytecorev1.ExecutionError_KIND_SYSTEM
		}
		ev.Error = &flytecorev1.ExecutionError{Code: e.Code, Kind: kind, Message: e.Message}
	}
	return ev
}

// recordTimeout bounds a Record call: a batch of up to maxBatch events.
const recordTimeout = 30 * time.Second

// NewClient returns an events service client for url, with the credentials and trust of
// conn (see rpcclient.Options; a zero Timeout means recordTimeout): HTTP/2 over TLS for
// https:// URLs, h2c for http:// ones. The executor passes its tracing interceptor in
// opts.
func NewClient(url string, conn rpcclient.Options, opts ...connect.ClientOption) (eventsv1connect.EventsServiceClient, error) {
	if conn.Timeout == 0 {
		conn.Timeout = recordTimeout
	}
	httpClient, err := rpcclient.New(conn)
	if err != nil {
		return nil, fmt.Errorf("eventsink: %w", err)
	}
	return eventsv1connect.NewEventsServiceClient(httpClient, url, opts...), nil
}
