// Package relay publishes the events service's outbox (events/outbox) to its CloudEvents
// sinks (events/cloudevents): in order per action, at least once, nothing lost.
//
// One replica relays at a time: the one holding the outbox's leadership (a Postgres
// advisory lock on a session of its own). The others try again every few seconds and
// take over once the leader's session is gone. Every replica notes, now and then, the
// sinks it is configured with; the leader registers its sinks, removes the cursor of
// one it does not know only once no replica has noted it for Config.ForgetSinksAfter
// (a rollout adding a sink runs leaders that do not know it), and runs one loop per sink, so a slow or dead sink holds up neither
// another one nor Record. A loop publishes the dead letters asked to be replayed, then
// the next entries after its cursor; it moves the cursor past what the sink delivered
// or refused for good (refusals become dead letters), and on a transient failure waits
// with the shared capped, jittered backoff and sends the same entries again: a
// CloudEvent keeps its id, so a consumer can drop the rare duplicate. Loops wake on the
// hub's notifications of recorded events, and poll besides.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/internal/backoff"
	"github.com/flytekube/backend/internal/periodic"
)

// Config says what the relay publishes where, and how often it looks.
type Config struct {
	// Sinks are the configured sinks; none disables the relay (and the outbox, once a
	// leader has unregistered every sink).
	Sinks []cloudevents.Config
	// Cluster names this cluster in each CloudEvent's source.
	Cluster string
	// Batch bounds the entries read, and published, at once.
	Batch int
	// Poll is how long a sink's loop waits for a notification before it looks anyway (a
	// transaction that ended without one may have made entries readable).
	Poll time.Duration
	// Backoff spaces the tries after a sink's transient failure, or the database's.
	Backoff backoff.Backoff
	// LeaderCheck is how often the leader checks it still leads, and a standby tries to.
	LeaderCheck time.Duration
	// LeaderTimeout bounds a check: a session that does not answer within it is taken
	// for lost. A slow answer is not a loss, so it is longer than LeaderCheck.
	LeaderTimeout time.Duration
	// Trim is how often the leader deletes what every sink has passed.
	Trim time.Duration
	// Lag is how often the leader measures each sink's backlog for the metrics.
	Lag time.Duration
	// SinkHeartbeat is how often a replica notes that it is configured with its sinks
	// (registering one that is missing).
	SinkHeartbeat time.Duration
	// ForgetSinksAfter is how long the leader keeps the cursor of a sink it is not
	// configured with after a replica last noted it: while kept, the sink's backlog
	// holds trimming back; once removed, a replica configured with it again registers it
	// at the then current end.
	ForgetSinksAfter time.Duration
}

// DefaultForgetSinksAfter is Config.ForgetSinksAfter's default: longer than a rollout
// takes, or an outage of every replica configured with a sink lasts.
const DefaultForgetSinksAfter = 7 * 24 * time.Hour

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Cluster == "" {
		c.Cluster = "default"
	}
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.Backoff.Base <= 0 || c.Backoff.Cap <= 0 {
		c.Backoff = backoff.Backoff{Base: 100 * time.Millisecond, Cap: 30 * time.Second}
	}
	if c.LeaderCheck <= 0 {
		c.LeaderCheck = 2 * time.Second
	}
	if c.LeaderTimeout <= 0 {
		c.LeaderTimeout = 10 * time.Second
	}
	if c.Trim <= 0 {
		c.Trim = 5 * time.Second
	}
	if c.Lag <= 0 {
		c.Lag = 5 * time.Second
	}
	if c.SinkHeartbeat <= 0 {
		c.SinkHeartbeat = time.Minute
	}
	if c.ForgetSinksAfter <= 0 {
		c.ForgetSinksAfter = DefaultForgetSinksAfter
	}
	return c
}

// Relay publishes the outbox while its replica leads.
type Relay struct {
	cfg     Config
	outbox  *outbox.Outbox
	nudges  <-chan struct{}
	metrics *Metrics
	log     *slog.Logger
}

// New returns a relay of ob's entries to cfg's sinks; nudges (the watch hub's) wakes it
// when events are recorded, on any replica.
func New(ob *outbox.Outbox, cfg Config, nudges <-chan struct{}, m *Metrics, log *slog.Logger) *Relay {
	return &Relay{cfg: cfg.WithDefaults(), outbox: ob, nudges: nudges, metrics: m, log: log}
}

// Run relays whenever this replica leads, until ctx ends.
func (r *Relay) Run(ctx context.Context) {
	failures := int32(0)
	var noted time.Time // when this standby last noted its sinks (the service did at start)
	for ctx.Err() == nil {
		lead, err := r.outbox.TryLead(ctx)
		switch {
		case errors.Is(err, outbox.ErrLedElsewhere):
			failures = 0
			if noted.IsZero() {
				noted = time.Now()
			} else if time.Since(noted) >= r.cfg.SinkHeartbeat {
				r.noteSinks(ctx)
				noted = time.Now()
			}
			sleep(ctx, jitter(r.cfg.LeaderCheck))
			continue
		case err != nil:
			if ctx.Err() == nil {
				r.log.Warn("could not try to lead the CloudEvents relay", "error", err)
			}
			failures++
			sleep(ctx, r.cfg.Backoff.Delay(failures))
			continue
		}
		failures = 0
		r.log.Info("leading the CloudEvents relay", "sinks", len(r.cfg.Sinks))
		r.metrics.leading(true)
		err = r.lead(ctx, lead)
		r.metrics.leading(false)
		release, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = lead.Release(release)
		cancel()
		if ctx.Err() == nil {
			r.log.Warn("stopped leading the CloudEvents relay", "error", err)
			sleep(ctx, jitter(r.cfg.LeaderCheck))
		}
	}
}

// names are the configured sinks' names.
func (r *Relay) names() []string {
	names := make([]string, len(r.cfg.Sinks))
	for i, s := range r.cfg.Sinks {
		names[i] = s.Name()
	}
	return names
}

// noteSinks notes, as a standby, that this replica is configured with its sinks, so
// that no leader of another configuration forgets them.
func (r *Relay) noteSinks(ctx context.Context) {
	added, err := r.outbox.AddSinks(ctx, r.names())
	switch {
	case err != nil && ctx.Err() == nil:
		r.log.Warn("noting the configured CloudEvents sinks failed", "error", err)
	case len(added) > 0:
		// Someone unregistered a sink this replica is still configured with.
		r.log.Warn("CloudEvents sinks registered again at the end of the outbox: they were unregistered while this replica was configured with them", "sinks", added)
	}
}

// register registers the leader's sinks, and removes those no replica has noted for
// ForgetSinksAfter.
func (r *Relay) register(ctx context.Context) error {
	changes, err := r.outbox.RegisterSinks(ctx, r.names(), r.cfg.ForgetSinksAfter)
	if err != nil {
		return err
	}
	if len(changes.Added) > 0 || len(changes.Removed) > 0 {
		r.log.Info("CloudEvents sinks registered", "added", changes.Added, "removed", changes.Removed,
			"removed_after", r.cfg.ForgetSinksAfter.String())
	}
	return nil
}

// lead registers the sinks and relays to each until ctx ends or the leadership is lost.
func (r *Relay) lead(ctx context.Context, l *outbox.Leadership) error {
	// Room for a few batches of every sink, so sinks that keep up share conversions.
	cache := newConverted(r.cfg.Cluster, 4*r.cfg.Batch*max(len(r.cfg.Sinks), 1))
	if err := r.register(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wakes := make([]chan struct{}, len(r.cfg.Sinks))
	for i, s := range r.cfg.Sinks {
		wakes[i] = make(chan struct{}, 1)
		wg.Go(func() { r.relaySink(ctx, s, wakes[i], cache) })
	}
	wg.Go(func() { r.fanOut(ctx, wakes) })
	wg.Go(func() { periodic.Every(ctx, r.cfg.Trim, r.trim) })
	wg.Go(func() { periodic.Every(ctx, r.cfg.Lag, r.measureLag) })
	wg.Go(func() {
		// Registered just now; again after each heartbeat, to note the sinks and forget
		// those long unconfigured.
		sleep(ctx, r.cfg.SinkHeartbeat)
		periodic.Every(ctx, r.cfg.SinkHeartbeat, func(ctx context.Context) {
			if err := r.register(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("registering the CloudEvents sinks failed", "error", err)
			}
		})
	})
	wg.Go(func() {
		t := time.NewTicker(r.cfg.LeaderCheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			check, cancelCheck := context.WithTimeout(ctx, r.cfg.LeaderTimeout)
			err := l.Check(check)
			cancelCheck()
			if err != nil && ctx.Err() == nil {
				cancel(err)
				return
			}
		}
	})
	wg.Wait()
	return context.Cause(ctx)
}

// fanOut passes each nudge on to every sink's loop, never blocking.
func (r *Relay) fanOut(ctx context.Context, wakes []chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.nudges:
		}
		for _, w := range wakes {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
}

// relaySink publishes to one sink until ctx ends.
func (r *Relay) relaySink(ctx context.Context, sc cloudevents.Config, wake <-chan struct{}, cache *converted) {
	name := sc.Name()
	log := r.log.With("sink", name)
	var sink cloudevents.Sink
	defer func() {
		if sink != nil {
			_ = sink.Close()
		}
	}()
	failures := int32(0)
	for ctx.Err() == nil {
		if sink == nil {
			var err error
			if sink, err = sc.Open(ctx); err != nil {
				sink = nil
				log.Warn("could not open the CloudEvents sink; trying again", "error", err)
				failures++
				sleep(ctx, r.cfg.Backoff.Delay(failures))
				continue
			}
		}
		progressed, failure, err := r.pass(ctx, sc, sink, cache)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("relaying to the CloudEvents sink failed; trying again", "error", err)
		case failure != "":
			r.metrics.retried(name)
			if failures == 0 {
				log.Warn("the CloudEvents sink failed; sending again after waits until it takes it", "detail", failure)
			}
		case progressed:
			failures = 0
			continue // there may be more already
		default:
			failures = 0
			select {
			case <-ctx.Done():
			case <-wake:
			case <-time.After(r.cfg.Poll):
			}
			continue
		}
		failures++
		sleep(ctx, r.cfg.Backoff.Delay(failures))
	}
}

// pass publishes what is due to one sink once: the dead letters asked to be replayed,
// then a batch of entries after its cursor. It reports whether it moved anything on, and
// the detail of a transient failure that ended it early.
func (r *Relay) pass(ctx context.Context, sc cloudevents.Config, sink cloudevents.Sink, cache *converted) (progressed bool, failure string, err error) {
	name := sc.Name()
	if progressed, failure, err = r.replay(ctx, sc, sink); err != nil || failure != "" {
		return progressed, failure, err
	}
	entries, err := r.outbox.Read(ctx, name, r.cfg.Batch)
	if err != nil || len(entries) == 0 {
		return progressed, "", err
	}
	// The events to publish, and the entry each comes from; an entry filtered out, or
	// one that is not an event a sink could take, is handled here.
	var events []event.Event
	var from []int
	for i, e := range entries {
		if e.Event == nil {
			if err := r.deadLetter(ctx, name, e, e.DecodeErr.Error()); err != nil {
				return progressed, "", err
			}
			continue
		}
		if !sc.Accepts(e.Event) {
			continue
		}
		ce, err := cache.get(e)
		if err != nil {
			if err := r.deadLetter(ctx, name, e, err.Error()); err != nil {
				return progressed, "", err
			}
			continue
		}
		events = append(events, ce)
		from = append(from, i)
	}
	// handled counts the entries, from the first, whose fate is settled.
	handled := len(entries)
	if len(events) > 0 {
		pctx, span := tracer.Start(ctx, "cloudevents.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("flyte.sink", name), attribute.Int("flyte.events", len(events))))
		results, perr := sink.Publish(pctx, events)
		endPublish(span, results, perr)
		now := time.Now()
		for k, res := range results {
			e := entries[from[k]]
			switch res.Outcome {
			case cloudevents.Delivered:
				r.metrics.published(name, now.Sub(e.RecordedAt))
			case cloudevents.Reject:
				if err := r.deadLetter(ctx, name, e, res.Detail); err != nil {
					return progressed, "", err
				}
			default: // Retry: this entry and all after it go again
				handled, failure = from[k], res.Detail
			}
			if failure != "" {
				break
			}
		}
		if failure == "" && len(results) < len(events) {
			// The call ended early (ctx): what was not attempted goes again.
			handled, failure = from[len(results)], fmt.Sprint(perr)
		}
	}
	if handled > 0 {
		// Recorded even when the relay is stopping, so that what the sink took is not
		// sent again by the next leader.
		done, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err := r.outbox.Advance(done, name, entries[handled-1].Position)
		cancel()
		if err != nil {
			return progressed, failure, err
		}
		progressed = true
	}
	return progressed, failure, nil
}

// replay publishes the sink's dead letters asked to be replayed, oldest first.
func (r *Relay) replay(ctx context.Context, sc cloudevents.Config, sink cloudevents.Sink) (progressed bool, failure string, err error) {
	name := sc.Name()
	letters, err := r.outbox.ReadReplays(ctx, name, r.cfg.Batch)
	if err != nil || len(letters) == 0 {
		return false, "", err
	}
	events := make([]event.Event, 0, len(letters))
	var ids []int64
	for _, dl := range letters {
		ev, cerr := dl.Entry.Event, dl.Entry.DecodeErr
		var ce event.Event
		if cerr == nil {
			ce, cerr = cloudevents.Convert(ev, r.cfg.Cluster)
		}
		if cerr != nil {
			if err := r.outbox.RejectedAgain(ctx, dl.ID, cerr.Error()); err != nil {
				return progressed, "", err
			}
			progressed = true
			continue
		}
		events = append(events, ce)
		ids = append(ids, dl.ID)
	}
	results, perr := sink.Publish(ctx, events)
	for k, res := range results {
		switch res.Outcome {
		case cloudevents.Delivered:
			err = r.outbox.Replayed(ctx, ids[k])
			r.metrics.replayed(name)
		case cloudevents.Reject:
			err = r.outbox.RejectedAgain(ctx, ids[k], res.Detail)
			r.metrics.deadLettered(name)
		default:
			return progressed, res.Detail, nil
		}
		if err != nil {
			return progressed, "", err
		}
		progressed = true
	}
	if len(results) < len(events) {
		return progressed, fmt.Sprint(perr), nil
	}
	return progressed, "", nil
}

// tracer records a span per batch handed to a sink: which sink, how many events, what
// became of them. The sink's address is not recorded (an HTTP receiver's query may hold
// its secrets).
var tracer = otel.Tracer("github.com/flytekube/backend/events/relay")

func endPublish(span trace.Span, results []cloudevents.Result, err error) {
	counts := map[cloudevents.Outcome]int{}
	for _, r := range results {
		counts[r.Outcome]++
	}
	span.SetAttributes(attribute.Int("flyte.delivered", counts[cloudevents.Delivered]),
		attribute.Int("flyte.rejected", counts[cloudevents.Reject]), attribute.Int("flyte.retry", counts[cloudevents.Retry]))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else if counts[cloudevents.Retry] > 0 {
		span.SetStatus(codes.Error, "the sink failed for a moment; sent again after a wait")
	}
	span.End()
}

func (r *Relay) deadLetter(ctx context.Context, sink string, e outbox.Entry, detail string) error {
	if err := r.outbox.DeadLetter(ctx, sink, e, detail); err != nil {
		return err
	}
	r.metrics.deadLettered(sink)
	r.log.Warn("a CloudEvents sink refused an event for good; kept as a dead letter",
		"sink", sink, "run", e.Key.Run, "action", e.Key.Action, "attempt", e.Attempt, "phase", e.Phase.String(), "detail", detail)
	return nil
}

func (r *Relay) trim(ctx context.Context) {
	for ctx.Err() == nil {
		n, err := r.outbox.Trim(ctx, 10000)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("trimming the outbox failed", "error", err)
			}
			return
		}
		r.metrics.trimmed(n)
		if n < 10000 {
			return
		}
	}
}

func (r *Relay) measureLag(ctx context.Context) {
	for _, s := range r.cfg.Sinks {
		n, oldest, err := r.outbox.Lag(ctx, s.Name())
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("measuring a CloudEvents sink's backlog failed", "sink", s.Name(), "error", err)
			}
			continue
		}
		r.metrics.backlog(s.Name(), n, oldest)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// jitter spreads d over [d/2, d], so that replicas do not try in step.
func jitter(d time.Duration) time.Duration { return wait.Jitter(d/2, 1) }
