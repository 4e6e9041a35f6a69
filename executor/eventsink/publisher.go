// Package eventsink delivers TaskAction phase changes to the events service.
//
// What is to be delivered is the action's own phase history, which the reconciler writes
// anyway: no extra API write is spent on events (the events service's outbox is another
// thing, that of its CloudEvents egress). The publisher keeps in memory how far each action
// has been delivered, batches the undelivered entries of many actions into one Record
// call, and retries with backoff while the events service is away, without holding up
// the actions themselves. The garbage collector deletes a finished action only once
// Delivered says its whole history is recorded. After a restart the publisher knows
// nothing, so the reconciler hands it every finished action again and their histories go
// once more; the events service absorbs the repeats. Delivery is at least once, in order
// per action. Events the events service refuses (InvalidArgument, as a replica older than
// the executor refuses an enum value it does not know, or an event too large for it) are
// held, not dropped: the action stays undelivered and they are offered again with a
// backoff of up to RefusalBackoffCap, with a gauge, a counter and a Warning Event, until a
// server takes them; they are given up on only after a number of refusals an operator
// set (WithMaxRefusals). An action that vanishes unfinished is closed with an Aborted
// entry from what the publisher last knew of it.
package eventsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
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
	"github.com/flytekube/backend/internal/textbound"
)

// ReasonEventsRefused is the reason of the Kubernetes Event recorded on an action whose
// events the events service refused for good.
const ReasonEventsRefused = "EventsRefused"

// ReasonEventsHeld is the reason of the Warning Event recorded on an action whose events
// the events service refused, each time they are held for another offer.
const ReasonEventsHeld = "EventsHeld"

// The spacing of the offers of an action's refused events: from RefusalBackoffBase,
// doubling with each refusal in a row, up to RefusalBackoffCap. A refusal is not cured by
// trying at once (an events service older than the executor refuses until it is
// upgraded, or the executor rolled back), and each offer costs the service a call, so
// the spacing grows further than a transient failure's (30 s); a few minutes keeps the
// delay after the cure short.
const (
	RefusalBackoffBase = time.Second
	RefusalBackoffCap  = 5 * time.Minute
)

// maxEventMessage bounds the message of a Kubernetes Event (the API's limit for a note).
const maxEventMessage = 1024

// maxBatch is the events service's limit per Record.
const maxBatch = 1000

// serviceReadLimit is the largest request the events service reads
// (events.DefaultMaxMessageBytes; a test checks that they agree): a larger one is refused
// with ResourceExhausted before it is looked at.
const serviceReadLimit = 8 << 20

// maxRequestBytes bounds the encoded size of one Record request, with a margin below
// serviceReadLimit for what a proxy on the way may add.
const maxRequestBytes = serviceReadLimit - serviceReadLimit/16

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
	// onDelivered are called, in order, with each finished action whose whole history has been
	// delivered (OnDelivered, NotifyDelivered); appended to under mu.
	onDelivered []func(*flytev1.TaskAction)
	// recorder, when set, records refusals on the actions.
	recorder record.EventRecorder
	// maxRefusals is how many refusals in a row an action's events are given up after;
	// 0, the default, never gives them up.
	maxRefusals int
	// refusalBackoff spaces the offers of refused events.
	refusalBackoff backoff.Backoff

	queue workqueue.TypedRateLimitingInterface[types.UID]
	// deleted wakes the reconciler for a deleted action once its history (its Aborted
	// entry included) has been delivered, so that it can let the action go.
	deleted chan event.TypedGenericEvent[*flytev1.TaskAction]

	mu sync.Mutex
	// states is keyed by UID, so that an action deleted and created again under the same
	// name keeps the undelivered history of its first incarnation apart. A state lives
	// while its action does, and after that only until its history is delivered.
	states map[types.UID]*state
	names  map[types.NamespacedName]types.UID
	// waiting counts the states with a pending snapshot: the delivery backlog, whether
	// its actions are ready or waiting out a backoff.
	waiting int
	// held counts the states whose last offer was refused (refusals > 0).
	held int
}

// state is everything the publisher knows of one action: the one place that says how
// far its history has been delivered.
type state struct {
	key types.NamespacedName
	// id is the action's identity to the events service (its spec's, which never
	// changes): a new object under the same name that has another is another action.
	id identity
	// pending is the newest state the reconciler wrote, kept until all of its history is
	// delivered: the informer cache may not have it yet, and the action may be deleted
	// meanwhile. Nil when nothing is left to deliver.
	pending *flytev1.TaskAction
	// delivered is the last entry the events service acknowledged; known is false until
	// one was, and after a restart, so that the whole history goes again.
	delivered flytev1.HistoryMark
	known     bool
	// gone: the action was deleted; the state goes once pending is delivered.
	gone bool
	// wake, when set, is the deleted action to wake the reconciler for once pending is
	// delivered (ReleaseWhenDelivered).
	wake *flytev1.TaskAction
	// last is what is kept of the newest snapshot of an unfinished action once it is
	// delivered (see compact): enough to close its history should the action vanish.
	last *flytev1.TaskAction
	// refusals counts the offers the events service refused in a row since the last
	// delivery (setRefusals keeps the gauge).
	refusals int
	// heldUntil is when events held after a refusal may be offered again: new history
	// handed over meanwhile waits for it too, so that a busy action is refused (and its
	// Event recorded) once per step of the backoff, not at every status write.
	heldUntil time.Time
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

// WithRecorder records a Kubernetes Event on each action whose events the events
// service refused for good.
func WithRecorder(r record.EventRecorder) Option {
	return func(p *Publisher) { p.recorder = r }
}

// WithMaxRefusals gives an action's events up after n refusals in a row by the events
// service, so that the action can go; n <= 0, the default, never gives them up. Events
// given up on are lost to the events service (they stay in the action's status while it
// exists), and an events service older than the executor refuses every event it does not
// know until it is upgraded: only an operator who prefers losing them to keeping their
// actions sets a limit (eventsDelivery.maxRefusals).
func WithMaxRefusals(n int) Option {
	return func(p *Publisher) { p.maxRefusals = max(n, 0) }
}

// WithRefusalBackoff spaces the offers of refused events from base, doubling up to cap
// (default RefusalBackoffBase and RefusalBackoffCap); tests shorten it.
func WithRefusalBackoff(base, cap time.Duration) Option {
	return func(p *Publisher) { p.refusalBackoff = backoff.Backoff{Base: base, Cap: cap} }
}

// OnDelivered calls f (from the delivering goroutine) with each finished action whose
// whole history the events service acknowledged, as NotifyDelivered does. Given more
// than once, each f is called, in order.
func OnDelivered(f func(*flytev1.TaskAction)) Option {
	return func(p *Publisher) { p.onDelivered = append(p.onDelivered, f) }
}

// New creates a publisher.
func New(c eventsv1connect.EventsServiceClient, cluster string, clk clock.PassiveClock, log *slog.Logger, opts ...Option) *Publisher {
	p := &Publisher{
		client: c, cluster: cluster, clock: clk, log: log, tracer: otel.Tracer(tracing.ScopeName),
		refusalBackoff: backoff.Backoff{Base: RefusalBackoffBase, Cap: RefusalBackoffCap},
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

// stateOf returns ta's state, new if unknown. A name is held by one object at a time,
// so a new UID under a known name means that the name's previous holder is gone: it is
// forgotten, and its UID returned to be queued if that left it something to deliver.
// The caller holds p.mu.
func (p *Publisher) stateOf(ta *flytev1.TaskAction) (st *state, predecessor types.UID) {
	if st = p.states[ta.UID]; st != nil {
		return st, ""
	}
	key := keyOf(ta)
	if old, ok := p.names[key]; ok {
		// An incarnation with the same identity in the events service continues its
		// predecessor's record there, so an Aborted closing the old one would compete
		// with the new one's outcome.
		if p.forgetLocked(old, p.states[old].id != identityOf(ta)) {
			predecessor = old
		}
	}
	st = &state{key: key, id: identityOf(ta)}
	p.states[ta.UID] = st
	p.names[key] = ta.UID
	return st, predecessor
}

// snapshot is the newest history known of the action: pending, or else what is kept of
// the last snapshot delivered; nil before anything is handed over.
func (st *state) snapshot() *flytev1.TaskAction {
	if st.pending != nil {
		return st.pending
	}
	return st.last
}

// identity is what makes two TaskActions one action to the events service.
type identity struct{ project, domain, run, action string }

func identityOf(ta *flytev1.TaskAction) identity {
	return identity{ta.Spec.Project, ta.Spec.Domain, ta.Spec.RunName, ta.Spec.ActionName}
}

// setPending changes a state's pending snapshot, keeping the backlog's count and gauge.
// The caller holds p.mu.
func (p *Publisher) setPending(st *state, ta *flytev1.TaskAction) {
	switch {
	case st.pending == nil && ta != nil:
		p.waiting++
	case st.pending != nil && ta == nil:
		p.waiting--
	}
	st.pending = ta
	p.metrics.Undelivered(p.waiting)
}

// add queues the actions with these UIDs; empty ones are skipped.
func (p *Publisher) add(uids ...types.UID) {
	for _, uid := range uids {
		if uid != "" {
			p.queue.Add(uid)
		}
	}
}

// Enqueue hands over ta as the reconciler just wrote it (or, after a restart, as it
// found it) to have its undelivered history delivered. Handing over what is already
// delivered or already waiting does nothing.
func (p *Publisher) Enqueue(ta *flytev1.TaskAction) {
	end, ok := ta.Status.PhaseHistory.Last()
	if !ok {
		return
	}
	p.mu.Lock()
	st, predecessor := p.stateOf(ta)
	added := p.enqueueLocked(st, ta, end.Mark())
	p.mu.Unlock()
	p.add(predecessor)
	if added {
		p.add(ta.UID)
	}
}

// ReleaseWhenDelivered reports whether all of a deleted action's history has been
// delivered, so that its finalizer may come off. If not, it hands ta over and the
// reconciler is woken (Source) once it is. The check and the request to be woken are
// one step: a delivery finishing in between cannot slip past, whichever snapshot it
// delivered.
func (p *Publisher) ReleaseWhenDelivered(ta *flytev1.TaskAction) bool {
	end, ok := ta.Status.PhaseHistory.Last()
	if !ok {
		return true
	}
	p.mu.Lock()
	st, predecessor := p.stateOf(ta)
	delivered := st.known && !st.delivered.Before(end.Mark())
	added := false
	if !delivered {
		st.wake = ta.DeepCopy()
		added = p.enqueueLocked(st, ta, end.Mark())
	}
	p.mu.Unlock()
	p.add(predecessor)
	if added {
		p.add(ta.UID)
	}
	return delivered
}

// enqueueLocked makes ta the state's pending snapshot unless what is delivered or
// waiting already reaches end, and reports whether it did. The caller holds p.mu.
func (p *Publisher) enqueueLocked(st *state, ta *flytev1.TaskAction, end flytev1.HistoryMark) bool {
	if st.known && !st.delivered.Before(end) {
		return false
	}
	if st.pending != nil {
		if have, _ := st.pending.Status.PhaseHistory.Last(); !have.Mark().Before(end) {
			return false
		}
	}
	p.setPending(st, ta.DeepCopy())
	return true
}

// NotifyDelivered calls f (from the delivering goroutine) with each finished action
// whose whole history the events service acknowledged from now on, after those given
// before: what depends on the publisher (the events backlog, which counts down by it)
// hears of deliveries without the publisher knowing of it.
func (p *Publisher) NotifyDelivered(f func(*flytev1.TaskAction)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onDelivered = append(p.onDelivered, f)
}

// Source wakes the reconciler for deleted actions whose history has been delivered, so
// that it can remove their finalizer.
func (p *Publisher) Source() source.Source {
	return source.Channel(p.deleted, &handler.TypedEnqueueRequestForObject[*flytev1.TaskAction]{})
}

// Delivered reports whether every history entry of ta has been delivered. After a
// restart nothing is, until the reconciler hands the action over again.
func (p *Publisher) Delivered(ta *flytev1.TaskAction) bool {
	end, ok := ta.Status.PhaseHistory.Last()
	if !ok {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.states[ta.UID]
	return st != nil && st.known && !st.delivered.Before(end.Mark())
}

// Forget is told that an action is gone. What it had not yet delivered still is; then
// its state goes. An action that vanished unfinished (deleted before its finalizer
// landed, say) gets an Aborted entry after the last it reported, so that the events
// service does not show it running for ever.
func (p *Publisher) Forget(key types.NamespacedName) {
	p.mu.Lock()
	uid, ok := p.names[key]
	if !ok {
		p.mu.Unlock()
		return
	}
	delete(p.names, key)
	more := p.forgetLocked(uid, true)
	p.mu.Unlock()
	if more {
		p.add(uid)
	}
}

// forgetLocked marks the action with this UID gone, closing its history with Aborted
// first if close is set and it is unfinished, and drops its state unless something is
// left to deliver, which it reports. The caller holds p.mu and has removed its name.
func (p *Publisher) forgetLocked(uid types.UID, close bool) bool {
	st := p.states[uid]
	if st == nil {
		return false
	}
	st.gone, st.wake = true, nil
	if close {
		if ta := p.aborted(st.snapshot()); ta != nil {
			p.setPending(st, ta)
		}
	}
	if st.pending == nil {
		delete(p.states, uid)
		return false
	}
	return true
}

// vanishedMessage explains an Aborted entry the publisher added.
const vanishedMessage = "the action was deleted before it finished; the executor recorded it aborted after the last phase it had reported"

// aborted returns ta with an Aborted entry ending its history, in the attempt of its
// last entry, or nil if ta is nil or already finished.
func (p *Publisher) aborted(ta *flytev1.TaskAction) *flytev1.TaskAction {
	if ta == nil {
		return nil
	}
	end, ok := ta.Status.PhaseHistory.Last()
	if !ok || end.Phase.IsTerminal() {
		return nil
	}
	at := p.clock.Now()
	if at.Before(end.OccurredAt.Time) { // a clock stepped back must not reorder the history
		at = end.OccurredAt.Time
	}
	ta = ta.DeepCopy() // snapshots are shared with deliveries in flight
	ta.Status.Phase = flytev1.PhaseAborted
	ta.Status.PhaseHistory = append(ta.Status.PhaseHistory, flytev1.PhaseTransition{
		Phase: flytev1.PhaseAborted, Attempt: end.Attempt, Version: ta.Status.PhaseHistory.NextVersion(end.Attempt),
		Reason: flytev1.ReasonAborted, Message: vanishedMessage, OccurredAt: metav1.NewMicroTime(at),
	})
	return ta
}

// compact is what is kept of a delivered snapshot: the action's names, identity and last
// entry, without its texts, links and cluster events.
func compact(ta *flytev1.TaskAction) *flytev1.TaskAction {
	end, _ := ta.Status.PhaseHistory.Last()
	return &flytev1.TaskAction{
		ObjectMeta: metav1.ObjectMeta{Namespace: ta.Namespace, Name: ta.Name, UID: ta.UID},
		Spec: flytev1.TaskActionSpec{Project: ta.Spec.Project, Domain: ta.Spec.Domain, RunName: ta.Spec.RunName,
			ActionName: ta.Spec.ActionName, TaskType: ta.Spec.TaskType},
		Status: flytev1.TaskActionStatus{Phase: ta.Status.Phase, Attempts: ta.Status.Attempts,
			PhaseHistory: []flytev1.PhaseTransition{{Phase: end.Phase, Attempt: end.Attempt, Version: end.Version, OccurredAt: end.OccurredAt}}},
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
	marks  []flytev1.HistoryMark // the history entry of each event
	size   int                   // the bytes events take in a request (eventBytes)
	end    flytev1.HistoryMark   // the last entry in events
	more   bool                  // entries after end remain
}

// head is the first k of w's events, to go alone: the others follow from the delivered
// mark once these are acknowledged.
func (w pending) head(k int) pending {
	h := pending{uid: w.uid, action: w.action, events: w.events[:k], marks: w.marks[:k], end: w.marks[k-1], more: true}
	for _, ev := range h.events {
		h.size += eventBytes(ev)
	}
	return h
}

// eventBytes is what ev adds to a RecordRequest's encoded size: its tag, its length and
// itself. A request's proto.Size is the sum over its events.
func eventBytes(ev *eventsv1.ActionEvent) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(ev))
}

func (p *Publisher) deliver(ctx context.Context, uids []types.UID) {
	var work []pending
	for _, uid := range uids {
		if wait := p.heldFor(uid); wait > 0 {
			p.queue.AddAfter(uid, wait)
			p.queue.Done(uid)
			continue
		}
		w := p.undelivered(uid)
		if len(w.events) == 0 {
			p.queue.Forget(uid)
			p.queue.Done(uid)
			if w.action != nil { // delivered meanwhile, under an older snapshot
				p.acknowledged(ctx, w)
			}
			continue
		}
		work = append(work, w)
	}
	// One Record per batch of up to maxBatch events and maxRequestBytes; an action's
	// events stay together and in order (undelivered bounds one action's part alike).
	for len(work) > 0 {
		n, events, size := 0, 0, 0
		for n < len(work) && (n == 0 || events+len(work[n].events) <= maxBatch && size+work[n].size <= maxRequestBytes) {
			events += len(work[n].events)
			size += work[n].size
			n++
		}
		part := work[:n]
		work = work[n:]
		p.send(ctx, part)
	}
}

// send records part's events in one request. A request the events service refuses as
// too large (its limit is smaller than maxRequestBytes assumes, or a proxy's is) goes
// again at once in halves: by actions, or for a single action the first half of its
// events, the others following once those are acknowledged; one event refused as too
// large even alone is refused for good, as an invalid one is (settle). A request refused
// as invalid goes again action by action: one action's bad event must not hold the
// others back, and only the bad one waits.
func (p *Publisher) send(ctx context.Context, part []pending) {
	var batch []*eventsv1.ActionEvent
	size := 0
	for _, w := range part {
		batch = append(batch, w.events...)
		size += w.size
	}
	err := p.record(ctx, part, batch)
	switch {
	case tooLarge(err) && len(batch) > 1:
		p.log.Warn("the events service refused a request as too large; sending it again in halves",
			"error", err, "actions", len(part), "events", len(batch), "bytes", size)
		if len(part) > 1 {
			p.send(ctx, part[:len(part)/2])
			p.send(ctx, part[len(part)/2:])
			return
		}
		p.send(ctx, []pending{part[0].head(len(part[0].events) / 2)})
	case connect.CodeOf(err) == connect.CodeInvalidArgument && len(part) > 1:
		for _, w := range part {
			p.send(ctx, []pending{w})
		}
	default:
		p.settle(ctx, part, batch, err)
	}
}

// tooLarge reports whether the events service refused a request for its size: its RPC
// server says "message size N is larger than configured max M" (a gRPC server
// "received message larger than max"). Its other ResourceExhausted errors (too many
// calls, or request bytes, in progress right now) are an overload, which the same
// request answers after a backoff, not smaller ones.
func tooLarge(err error) bool {
	var ce *connect.Error
	return connect.CodeOf(err) == connect.CodeResourceExhausted && errors.As(err, &ce) &&
		strings.Contains(strings.ToLower(ce.Message()), "larger than")
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
	// send offers an action's events alone before counting their refusal, and one event
	// alone before counting it too large.
	invalid := connect.CodeOf(err) == connect.CodeInvalidArgument || tooLarge(err)
	for _, w := range part {
		switch {
		case err == nil:
			p.done(ctx, w)
		case invalid:
			p.refused(ctx, w, err)
		default:
			p.retry(w)
		}
	}
	if err != nil && !invalid && ctx.Err() == nil {
		p.log.Warn("events service unavailable; will retry", "error", err, "actions", len(part), "events", len(batch))
	}
}

// done moves on an action whose events were delivered (or given up on).
func (p *Publisher) done(ctx context.Context, w pending) {
	p.queue.Forget(w.uid)
	p.queue.Done(w.uid)
	if p.acknowledged(ctx, w) {
		p.queue.Add(w.uid) // more entries, or newer ones written meanwhile
	}
}

// retry tries an action's delivery again after a backoff.
func (p *Publisher) retry(w pending) {
	p.queue.AddRateLimited(w.uid)
	p.queue.Done(w.uid)
}

// refused handles the events service refusing an action's events (InvalidArgument, or
// too large even alone). The executor cannot tell a refusal it caused from one by an
// events service older than itself, which refuses what it does not know until it is
// upgraded (or the executor rolled back), so the events are held: the action stays
// undelivered (the collector keeps it, a deleted one keeps its finalizer, a finished one
// counts toward the events backlog's bound) and they are offered again after a backoff
// that grows with each refusal in a row. Each refusal is recorded where an operator looks:
// a counter by code, the gauge of held actions, the log and a Warning Event on the
// action, one per offer, so at most one per step of the backoff. Only past a limit an
// operator set (WithMaxRefusals) are they given up on, so that the action can go; they
// stay in its status for as long as it exists.
func (p *Publisher) refused(ctx context.Context, w pending, err error) {
	p.metrics.EventsRefusal(connect.CodeOf(err))
	p.mu.Lock()
	tries := 0
	st := p.states[w.uid]
	if st != nil {
		p.setRefusals(st, st.refusals+1)
		tries = st.refusals
	}
	wait := p.refusalBackoff.Delay(int32(min(tries, 64)))
	hold := p.maxRefusals == 0 || tries < p.maxRefusals
	if st != nil && hold {
		// On the monotonic clock, as the work queue's delays are: a clock the
		// publisher is given (which tests may hold still) or a stepped wall clock must
		// not hold the events longer than their backoff.
		st.heldUntil = time.Now().Add(wait)
	}
	p.mu.Unlock()
	key := keyOf(w.action).String()
	if hold {
		p.log.Warn("events service refused an action's events; holding them to offer again",
			"error", err, "action", key, "events", len(w.events), "tries", tries, "next", wait.Round(time.Millisecond).String())
		if p.recorder != nil {
			p.recorder.Event(w.action, corev1.EventTypeWarning, ReasonEventsHeld, heldMessage(w, tries, wait, err))
		}
		p.queue.AddAfter(w.uid, wait)
		p.queue.Done(w.uid)
		return
	}
	p.log.Error("events service refused an action's events; giving up on them, as eventsDelivery.maxRefusals says, so that the action can go (they stay in its status)",
		"error", err, "action", key, "events", len(w.events), "tries", tries)
	p.metrics.EventsRefused(len(w.events))
	if p.recorder != nil {
		p.recorder.Event(w.action, corev1.EventTypeWarning, ReasonEventsRefused, refusalMessage(w, tries, err))
	}
	p.done(ctx, w)
}

// heldFor is how long the action's events are still held after a refusal; 0 when they
// may go.
func (p *Publisher) heldFor(uid types.UID) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.states[uid]; st != nil && st.refusals > 0 {
		return time.Until(st.heldUntil)
	}
	return 0
}

// setRefusals sets a state's refusals in a row, keeping the count and gauge of held
// actions. The caller holds p.mu.
func (p *Publisher) setRefusals(st *state, n int) {
	switch {
	case st.refusals == 0 && n > 0:
		p.held++
	case st.refusals > 0 && n == 0:
		p.held--
	default:
		st.refusals = n
		return
	}
	st.refusals = n
	p.metrics.RefusedActions(p.held)
}

// heldMessage says what is held, why, and when it goes again, within an Event's limit.
func heldMessage(w pending, tries int, wait time.Duration, err error) string {
	first := w.events[0]
	msg := fmt.Sprintf("the events service refused %d events of this action (attempt %d version %d to attempt %d version %d), %d times in a row; "+
		"they are held, and offered again in %s (an events service older than the executor refuses what it does not know until it is upgraded): %v",
		len(w.events), first.GetAttempt(), first.GetVersion(), w.end.Attempt, w.end.Version, tries, wait.Round(time.Second), err)
	return textbound.Cut(msg, maxEventMessage)
}

// refusalMessage says what was refused, and why, within an Event's limit.
func refusalMessage(w pending, tries int, err error) string {
	first := w.events[0]
	msg := fmt.Sprintf("the events service refused %d events of this action (attempt %d version %d to attempt %d version %d) %d times; "+
		"they are no longer sent and stay in status.phaseHistory: %v",
		len(w.events), first.GetAttempt(), first.GetVersion(), w.end.Attempt, w.end.Version, tries, err)
	return textbound.Cut(msg, maxEventMessage)
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
	p.setRefusals(st, 0)
	if w.more || st.pending != w.action {
		p.mu.Unlock()
		return true
	}
	// A finished action's history needs no closing: what is kept of it is its state's
	// marks alone, about a fifth of a compact snapshot, for as long as it is stored.
	st.last = nil
	if !w.action.Status.Phase.IsTerminal() {
		st.last = compact(w.action)
	}
	p.setPending(st, nil)
	wake := st.wake
	st.wake = nil
	if st.gone {
		delete(p.states, w.uid)
	}
	notify := p.onDelivered
	p.mu.Unlock()
	ta := w.action
	if ta.Status.Phase.IsTerminal() {
		for _, f := range notify {
			f(ta)
		}
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

// undelivered is the next part of an action's delivery: the history entries of its
// pending snapshot after its delivered mark, as events, at most maxBatch of them and
// (unless one alone is more) maxRequestBytes; more says whether others remain. Its
// action is nil when nothing is pending.
func (p *Publisher) undelivered(uid types.UID) pending {
	p.mu.Lock()
	st := p.states[uid]
	if st == nil || st.pending == nil {
		p.mu.Unlock()
		return pending{uid: uid}
	}
	ta, done, known := st.pending, st.delivered, st.known
	p.mu.Unlock()
	w := pending{uid: uid, action: ta, end: done}
	now := timestamppb.New(p.clock.Now())
	for _, h := range ta.Status.PhaseHistory {
		m := h.Mark()
		if known && !done.Before(m) {
			continue
		}
		ev := p.toEvent(ta, h, now)
		n := eventBytes(ev)
		if len(w.events) == maxBatch || len(w.events) > 0 && w.size+n > maxRequestBytes {
			w.more = true
			return w
		}
		w.events = append(w.events, ev)
		w.marks = append(w.marks, m)
		w.size += n
		w.end = m
	}
	return w
}

// ProtoPhase is the events service's name for an action's phase (UNSPECIFIED for a phase
// it has none for). It is the one map from the CRD's phases to the contract's, kept with
// the rest of the translation of a history entry to an event (toEvent): whatever
// compares the two (the chaos and upgrade checks) goes through it. Each side has its own
// rule of which phases end an action (flytev1.Phase.IsTerminal, store.IsTerminal); a
// test holds the map to agreeing with both.
func ProtoPhase(p flytev1.Phase) flytecorev1.ActionPhase { return phases[p] }

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
		Phase:       ProtoPhase(h.Phase),
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
			Object: e.Object, Type: e.Type, Reason: e.Reason, Message: e.Message, Source: e.Source, Count: uint32(max(e.Count, 0))})
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

// recordTimeout bounds a Record call: a batch of up to maxBatch events and
// maxRequestBytes.
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
