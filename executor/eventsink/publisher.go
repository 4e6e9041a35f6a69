// Package eventsink delivers TaskAction phase changes to the events service.
//
// The outbox is the action's own phase history, which the reconciler writes anyway: no
// extra API write is spent on events. The publisher keeps in memory how far each action
// has been delivered, batches the undelivered entries of many actions into one Record
// call, and retries with backoff while the events service is away, without holding up
// the actions themselves. A finished action is labeled for garbage collection only once
// its history has been delivered (the reconciler asks Delivered), and that label patch
// also records the delivery in an annotation, so that after a restart the executor knows
// what is done. Delivery is at least once, in order per action; the events service
// absorbs repeats.
package eventsink

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/metrics"
	"github.com/flytekube/backend/executor/tracing"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
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
	reader  client.Reader
	cluster string
	clock   clock.PassiveClock
	log     *slog.Logger
	tracer  trace.Tracer

	queue    workqueue.TypedRateLimitingInterface[types.NamespacedName]
	finished chan event.TypedGenericEvent[*flytev1.TaskAction]

	mu        sync.Mutex
	delivered map[types.NamespacedName]delivery
	// latest holds the newest state the reconciler wrote of each queued action: the
	// informer cache may not have it yet, and an older one would deliver too little.
	latest map[types.NamespacedName]*flytev1.TaskAction
}

// delivery is how far an action (this incarnation of its name) has been delivered.
type delivery struct {
	uid  types.UID
	mark mark
}

// mark identifies a history entry.
type mark struct{ attempt, version int32 }

func (m mark) String() string { return fmt.Sprintf("%d/%d", m.attempt, m.version) }

func (m mark) less(o mark) bool {
	return m.attempt < o.attempt || m.attempt == o.attempt && m.version < o.version
}

func parseMark(s string) (mark, bool) {
	a, v, ok := strings.Cut(s, "/")
	if !ok {
		return mark{}, false
	}
	attempt, err1 := strconv.Atoi(a)
	version, err2 := strconv.Atoi(v)
	return mark{int32(attempt), int32(version)}, err1 == nil && err2 == nil
}

// Option changes a publisher.
type Option func(*Publisher)

// WithTracerProvider sends the delivery spans to tp instead of the global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(p *Publisher) { p.tracer = tp.Tracer(tracing.ScopeName) }
}

// New creates a publisher reading actions through reader (the manager's cache).
func New(c eventsv1connect.EventsServiceClient, reader client.Reader, cluster string, clk clock.PassiveClock, log *slog.Logger, opts ...Option) *Publisher {
	p := &Publisher{
		client: c, reader: reader, cluster: cluster, clock: clk, log: log, tracer: otel.Tracer(tracing.ScopeName),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "events"}),
		finished:  make(chan event.TypedGenericEvent[*flytev1.TaskAction], 1024),
		delivered: make(map[types.NamespacedName]delivery),
		latest:    make(map[types.NamespacedName]*flytev1.TaskAction),
	}
	for _, opt := range opts {
		opt(p)
	}
	return p
}

// Enqueue asks for the undelivered history of ta, as the reconciler just wrote it, to
// be delivered.
func (p *Publisher) Enqueue(ta *flytev1.TaskAction) {
	key := types.NamespacedName{Namespace: ta.Namespace, Name: ta.Name}
	p.mu.Lock()
	p.latest[key] = ta.DeepCopy()
	p.mu.Unlock()
	p.queue.Add(key)
	metrics.Outbox(p.queue.Len())
}

// Source wakes the reconciler for finished actions whose history has been delivered,
// so that it can label them.
func (p *Publisher) Source() source.Source {
	return source.Channel(p.finished, &handler.TypedEnqueueRequestForObject[*flytev1.TaskAction]{})
}

func last(ta *flytev1.TaskAction) (mark, bool) {
	h := ta.Status.PhaseHistory
	if len(h) == 0 {
		return mark{}, false
	}
	return mark{h[len(h)-1].Attempt, h[len(h)-1].Version}, true
}

// deliveredMark is how far ta has been delivered, from memory or, after a restart,
// from its annotation.
func (p *Publisher) deliveredMark(ta *flytev1.TaskAction) (mark, bool) {
	p.mu.Lock()
	d, ok := p.delivered[types.NamespacedName{Namespace: ta.Namespace, Name: ta.Name}]
	p.mu.Unlock()
	if ok && d.uid == ta.UID {
		return d.mark, true
	}
	return parseMark(ta.Annotations[flytev1.AnnotationEventsDelivered])
}

// Delivered reports whether every history entry of ta has been delivered and, if so,
// the mark to record in flytev1.AnnotationEventsDelivered.
func (p *Publisher) Delivered(ta *flytev1.TaskAction) (bool, string) {
	end, ok := last(ta)
	if !ok {
		return true, ""
	}
	done, known := p.deliveredMark(ta)
	if !known || done.less(end) {
		return false, ""
	}
	return true, end.String()
}

// Forget drops what is known of an action that is gone.
func (p *Publisher) Forget(key types.NamespacedName) {
	p.mu.Lock()
	delete(p.delivered, key)
	delete(p.latest, key)
	p.mu.Unlock()
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
		keys, ok := p.next()
		if !ok {
			return nil
		}
		p.deliver(ctx, keys)
		metrics.Outbox(p.queue.Len())
	}
}

// next blocks for one key, then takes whatever else is already queued: one Record
// carries many actions' events.
func (p *Publisher) next() ([]types.NamespacedName, bool) {
	key, shutdown := p.queue.Get()
	if shutdown {
		return nil, false
	}
	keys := []types.NamespacedName{key}
	for len(keys) < maxBatch && p.queue.Len() > 0 {
		k, shutdown := p.queue.Get()
		if shutdown {
			break
		}
		keys = append(keys, k)
	}
	return keys, true
}

type pending struct {
	key    types.NamespacedName
	action *flytev1.TaskAction
	events []*eventsv1.ActionEvent
	end    mark // the last entry in events
	more   bool // entries after end remain
}

func (p *Publisher) deliver(ctx context.Context, keys []types.NamespacedName) {
	var work []pending
	for _, key := range keys {
		ta, err := p.action(ctx, key)
		if err != nil {
			// Gone (deleted, or collected after delivery): nothing left to deliver.
			p.queue.Forget(key)
			p.queue.Done(key)
			continue
		}
		evs, end, more := p.undelivered(ta)
		if len(evs) == 0 {
			p.done(ctx, key, ta)
			continue
		}
		work = append(work, pending{key: key, action: ta, events: evs, end: end, more: more})
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
		metrics.DeliveryFailed()
	} else {
		now := p.clock.Now()
		lags := make([]time.Duration, len(batch))
		for i, ev := range batch {
			lags[i] = now.Sub(ev.GetOccurredAt().AsTime())
		}
		metrics.Delivered(lags)
	}
	for _, w := range part {
		if err != nil {
			p.queue.AddRateLimited(w.key)
			p.queue.Done(w.key)
			continue
		}
		p.mu.Lock()
		p.delivered[w.key] = delivery{uid: w.action.UID, mark: w.end}
		p.mu.Unlock()
		if w.more {
			p.queue.Forget(w.key)
			p.queue.Done(w.key)
			p.queue.Add(w.key)
			continue
		}
		p.done(ctx, w.key, w.action)
	}
	switch {
	case err == nil || ctx.Err() != nil:
	case connect.CodeOf(err) == connect.CodeInvalidArgument:
		// Not the service's fault, and retrying will not help until the executor is
		// fixed; the events stay in the action's history, and it is not released.
		p.log.Error("events service refused an action's events; keeping them and retrying",
			"error", err, "action", part[0].key.String(), "events", len(batch))
	default:
		p.log.Warn("events service unavailable; will retry", "error", err, "actions", len(part), "events", len(batch))
	}
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

// action is the newest known state of an action: the reconciler's, else the cache's.
func (p *Publisher) action(ctx context.Context, key types.NamespacedName) (*flytev1.TaskAction, error) {
	p.mu.Lock()
	ta, ok := p.latest[key]
	delete(p.latest, key)
	p.mu.Unlock()
	if ok {
		return ta, nil
	}
	var got flytev1.TaskAction
	if err := p.reader.Get(ctx, key, &got); err != nil {
		return nil, err
	}
	return &got, nil
}

// done finishes a key; a finished action goes back to the reconciler for its label.
// The reconciler's source drains the channel continuously, so waiting here is brief,
// and nothing is dropped: no periodic resync would find a dropped action soon.
func (p *Publisher) done(ctx context.Context, key types.NamespacedName, ta *flytev1.TaskAction) {
	p.queue.Forget(key)
	p.queue.Done(key)
	if ta.Status.Phase.IsTerminal() {
		select {
		case p.finished <- event.TypedGenericEvent[*flytev1.TaskAction]{Object: ta}:
		case <-ctx.Done():
		}
	}
}

// undelivered turns the history entries after the delivered mark into events, at most
// maxBatch of them; more says whether others remain.
func (p *Publisher) undelivered(ta *flytev1.TaskAction) (evs []*eventsv1.ActionEvent, end mark, more bool) {
	done, known := p.deliveredMark(ta)
	now := timestamppb.New(p.clock.Now())
	for _, h := range ta.Status.PhaseHistory {
		m := mark{h.Attempt, h.Version}
		if known && !done.less(m) {
			continue
		}
		if len(evs) == maxBatch {
			return evs, end, true
		}
		evs = append(evs, p.toEvent(ta, h, now))
		end = m
	}
	return evs, end, false
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
