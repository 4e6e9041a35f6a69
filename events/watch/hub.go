// Package watch fans action changes out to WatchActions streams.
//
// Every replica runs one Hub. It LISTENs on the store's notify channel over one
// dedicated connection, so an event recorded through any replica reaches watchers on all
// of them. Notifications only carry action keys; the hub coalesces the keys that arrive
// while it is busy, reads the current state of those that some watcher wants in one
// query, and hands each watcher its matches. A watcher that cannot keep up is ended
// (ErrOverflow) rather than allowed to block the hub or grow memory; when the hub loses
// its connection, notifications may have been missed, so every watcher is ended
// (ErrResync). Either way the client resumes from ListActions. Watchers cost memory and a
// goroutine each, so the hub bounds them, per replica and per caller (ErrTooManyWatchers).
package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flytekube/backend/events/store"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/internal/backoff"
)

var (
	// ErrOverflow ends a watcher whose buffer filled up.
	ErrOverflow = errors.New("watcher fell behind; resume from ListActions")
	// ErrResync ends every watcher when notifications may have been missed.
	ErrResync = errors.New("watch feed was interrupted; resume from ListActions")
	// ErrClosed ends every watcher when the hub stops.
	ErrClosed = errors.New("server is shutting down")
	// ErrTooManyWatchers refuses a subscription beyond a limit; see LimitError.
	ErrTooManyWatchers = errors.New("too many watchers")
)

// LimitError refuses a subscription beyond one of the hub's limits.
type LimitError struct {
	// Limit is "service" (all watchers of this replica) or "identity" (one caller's).
	Limit string
	// Max is the limit's value.
	Max int
}

func (e *LimitError) Error() string {
	if e.Limit == "identity" {
		return fmt.Sprintf("this caller already holds %d watches on this replica, the most allowed; close one first", e.Max)
	}
	return fmt.Sprintf("this replica already serves %d watches, the most allowed; retry later", e.Max)
}

// Is makes errors.Is(err, ErrTooManyWatchers) true.
func (e *LimitError) Is(target error) bool { return target == ErrTooManyWatchers }

// Config sizes a hub.
type Config struct {
	// Buffer bounds the updates queued for one subscription before it is ended.
	Buffer int
	// MaxWatchers bounds the open subscriptions; 0 means no limit.
	MaxWatchers int
	// MaxWatchersPerIdentity bounds one identity's open subscriptions; 0 means no limit.
	MaxWatchersPerIdentity int
}

// Filter selects the actions a watcher wants.
type Filter struct {
	Project, Domain string
	// Run narrows to one run when not empty.
	Run string
}

func (f Filter) matches(k store.Key) bool {
	return k.Project == f.Project && k.Domain == f.Domain && (f.Run == "" || k.Run == f.Run)
}

// Subscription is one watcher's feed.
type Subscription struct {
	filter   Filter
	identity string
	ch       chan *eventsv1.Action
	done     chan struct{}
	err      error // set before done is closed
}

// C delivers the new state of each matching action.
func (s *Subscription) C() <-chan *eventsv1.Action { return s.ch }

// Done is closed when the hub ends the subscription; Err then says why.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err says why the subscription ended.
func (s *Subscription) Err() error { return s.err }

// Metrics observes the hub; nil fields are ignored.
type Metrics struct {
	// Watchers is set to the number of open subscriptions.
	Watchers func(n int)
	// Ended counts subscriptions ended by the hub, by reason.
	Ended func(reason string)
	// Refused counts subscriptions refused by a limit ("service" or "identity").
	Refused func(limit string)
}

// Hub distributes action changes to subscriptions.
type Hub struct {
	pool    *pgxpool.Pool
	store   *store.Store
	cfg     Config
	log     *slog.Logger
	metrics Metrics

	mu         sync.Mutex
	subs       map[*Subscription]struct{}
	byIdentity map[string]int // open subscriptions per identity
	listening  chan struct{}  // closed while a LISTEN is established; replaced on loss
	pending    map[store.Key]struct{}
	wake       chan struct{}
	nudges     []chan struct{} // Nudges' channels
}

// NewHub creates a hub sized by cfg.
func NewHub(pool *pgxpool.Pool, st *store.Store, cfg Config, log *slog.Logger, m Metrics) *Hub {
	cfg.Buffer = max(cfg.Buffer, 1)
	return &Hub{
		pool: pool, store: st, cfg: cfg, log: log, metrics: m,
		subs:       make(map[*Subscription]struct{}),
		byIdentity: make(map[string]int),
		listening:  make(chan struct{}),
		pending:    make(map[store.Key]struct{}),
		wake:       make(chan struct{}, 1),
	}
}

// Nudges returns a channel that receives (without blocking the hub, coalesced) after
// each notification of recorded events, whichever actions they name: the CloudEvents
// relay wakes on it rather than polling alone.
func (h *Hub) Nudges() <-chan struct{} {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	h.nudges = append(h.nudges, ch)
	h.mu.Unlock()
	return ch
}

// Subscribe opens a subscription for identity once the hub is listening, so that nothing
// recorded after Subscribe returns can be missed. It waits for ctx otherwise, and refuses
// with a *LimitError when the hub or identity holds as many as allowed.
func (h *Hub) Subscribe(ctx context.Context, f Filter, identity string) (*Subscription, error) {
	for {
		h.mu.Lock()
		listening := h.listening
		select {
		case <-listening:
			if err := h.checkLimitsLocked(identity); err != nil {
				h.mu.Unlock()
				if h.metrics.Refused != nil {
					h.metrics.Refused(err.Limit)
				}
				return nil, err
			}
			s := &Subscription{filter: f, identity: identity, ch: make(chan *eventsv1.Action, h.cfg.Buffer), done: make(chan struct{})}
			h.subs[s] = struct{}{}
			h.byIdentity[identity]++
			n := len(h.subs)
			h.mu.Unlock()
			h.observeWatchers(n)
			return s, nil
		default:
		}
		h.mu.Unlock()
		select {
		case <-listening:
		case <-ctx.Done():
			return nil, fmt.Errorf("watch: waiting for the change feed: %w", ctx.Err())
		}
	}
}

func (h *Hub) checkLimitsLocked(identity string) *LimitError {
	if h.cfg.MaxWatchers > 0 && len(h.subs) >= h.cfg.MaxWatchers {
		return &LimitError{Limit: "service", Max: h.cfg.MaxWatchers}
	}
	if h.cfg.MaxWatchersPerIdentity > 0 && h.byIdentity[identity] >= h.cfg.MaxWatchersPerIdentity {
		return &LimitError{Limit: "identity", Max: h.cfg.MaxWatchersPerIdentity}
	}
	return nil
}

// Unsubscribe removes a subscription; it is safe to call after the hub ended it.
func (h *Hub) Unsubscribe(s *Subscription) {
	h.mu.Lock()
	_, ok := h.subs[s]
	if ok {
		h.removeLocked(s)
	}
	n := len(h.subs)
	h.mu.Unlock()
	if ok {
		h.observeWatchers(n)
	}
}

// removeLocked forgets a subscription and gives its identity's place back; h.mu must be
// held and s open.
func (h *Hub) removeLocked(s *Subscription) {
	delete(h.subs, s)
	if h.byIdentity[s.identity]--; h.byIdentity[s.identity] == 0 {
		delete(h.byIdentity, s.identity)
	}
}

// endLocked ends a subscription with err; h.mu must be held.
func (h *Hub) endLocked(s *Subscription, err error, reason string) {
	h.removeLocked(s)
	s.err = err
	close(s.done)
	if h.metrics.Ended != nil {
		h.metrics.Ended(reason)
	}
}

func (h *Hub) endAll(err error, reason string) {
	h.mu.Lock()
	for s := range h.subs {
		h.endLocked(s, err, reason)
	}
	h.mu.Unlock()
	h.observeWatchers(0)
}

func (h *Hub) observeWatchers(n int) {
	if h.metrics.Watchers != nil {
		h.metrics.Watchers(n)
	}
}

// Run listens and dispatches until ctx ends, reconnecting after connection loss.
func (h *Hub) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { h.dispatchLoop(ctx) })
	defer wg.Wait()
	defer h.endAll(ErrClosed, "shutdown")

	delays := reconnect.DelayFunc()
	for {
		listened, err := h.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if listened { // a new outage, not the last one going on
			delays = reconnect.DelayFunc()
		}
		delay := delays()
		h.log.Warn("change feed lost; reconnecting", "error", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// reconnect spaces the hub's tries to listen again, from the loss of a feed that worked.
var reconnect = backoff.Backoff{Base: 100 * time.Millisecond, Cap: 5 * time.Second}

// listen holds one LISTEN connection until it fails; listened says whether it got as far
// as listening.
func (h *Hub) listen(ctx context.Context) (listened bool, _ error) {
	pooled, err := h.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("watch: acquiring connection: %w", err)
	}
	conn := pooled.Hijack() // held for as long as it lives; never returned to the pool
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{store.NotifyChannel}.Sanitize()); err != nil {
		return false, fmt.Errorf("watch: LISTEN: %w", err)
	}

	h.mu.Lock()
	close(h.listening)
	h.mu.Unlock()
	defer func() {
		// Whatever was notified while nobody listened is lost: end every watcher so its
		// client re-lists, and make new subscribers wait for the next LISTEN.
		h.mu.Lock()
		h.listening = make(chan struct{})
		h.mu.Unlock()
		if ctx.Err() == nil {
			h.endAll(ErrResync, "resync")
		}
	}()

	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, fmt.Errorf("watch: waiting for notifications: %w", err)
		}
		if n.Payload == store.ResyncPayload {
			// A replica could not announce some changes: nobody's view can be trusted.
			h.endAll(ErrResync, "resync")
			continue
		}
		keys, err := store.ParseKeys(n.Payload)
		if err != nil {
			h.log.Warn("ignoring malformed notification", "payload", n.Payload)
			continue
		}
		h.mu.Lock()
		for _, ch := range h.nudges {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		wanted := false
		for _, key := range keys {
			for s := range h.subs {
				if s.filter.matches(key) {
					h.pending[key] = struct{}{}
					wanted = true
					break
				}
			}
		}
		h.mu.Unlock()
		if wanted {
			select {
			case h.wake <- struct{}{}:
			default:
			}
		}
	}
}

// dispatchLoop reads the state of pending actions, a batch at a time, and hands it out.
func (h *Hub) dispatchLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		}
		h.mu.Lock()
		keys := make([]store.Key, 0, len(h.pending))
		for k := range h.pending {
			keys = append(keys, k)
		}
		clear(h.pending)
		h.mu.Unlock()
		if len(keys) == 0 {
			continue
		}
		actions, err := h.store.ActionsByKey(ctx, keys)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The updates are lost to the watchers that wanted them: make them re-list.
			h.log.Error("reading changed actions", "error", err, "actions", len(keys))
			h.endAll(ErrResync, "resync")
			continue
		}
		h.deliver(actions)
	}
}

func (h *Hub) deliver(actions []*eventsv1.Action) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range actions {
		key := store.KeyOf(a.GetId())
		for s := range h.subs {
			if !s.filter.matches(key) {
				continue
			}
			select {
			case s.ch <- a:
			default:
				h.endLocked(s, ErrOverflow, "overflow")
			}
		}
	}
	h.observeWatchersLocked()
}

func (h *Hub) observeWatchersLocked() {
	if h.metrics.Watchers != nil {
		h.metrics.Watchers(len(h.subs))
	}
}
