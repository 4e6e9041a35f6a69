// Package fairqueue is the executor's work queue. It serves tenants (namespaces) in turn,
// so that one tenant's backlog delays another's work by the number of tenants with work
// waiting, not by the length of the backlog: controller-runtime's own queue is first in,
// first out across all of them, and 5,000 actions created at once in one namespace put
// every action of every other namespace behind them.
//
// It keeps the contract of controller-runtime's priority queue, which the controller
// relies on: an item is queued once however often it is added (the highest of the
// priorities it was added with, the earliest of the times it was due); an item handed
// out is not handed out again before Done, and one added meanwhile waits for Done;
// higher priorities go first (controller-runtime adds the objects of an informer's
// first list at a low priority, so that a restart's backlog does not hold up new work).
//
// Unlike controller-runtime's queue, it does not let a lower priority wait for ever: an
// item ready for PromoteAfter while higher priorities are served is promoted to the
// highest priority with work, at the back of its tenant's line there, and handed out with
// that priority (so that the controller's requeues of it keep it). Without this, after a
// failover the new leader's first list, at low priority, and every requeue of it, which
// keeps the priority it had (timeouts, backoffs, cache waits), waited behind any stream of
// new work in any namespace. So an item waits behind higher priorities for at most
// PromoteAfter, and then as any item of that priority does.
//
// Within a priority, tenants with work are served in a round: each in its turn gets as
// many items as its weight (a weighted deficit round robin with unit costs), in the order
// its items became ready. An item at the front of a tenant's line so waits for at most
// the sum of the other tenants' weights; a line of k items drains at the tenant's weight
// per round whatever the other tenants hold.
package fairqueue

import (
	"cmp"
	"container/heap"
	"container/list"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// Options configure a Queue.
type Options[T comparable] struct {
	// TenantOf names the tenant an item belongs to.
	TenantOf func(T) string
	// Weight is how many items in a row a tenant is served in its turn; values below 1
	// count as 1. Nil weighs every tenant 1.
	Weight func(tenant string) int
	// RateLimiter spaces the items added with AddRateLimited. Default: a per-item
	// exponential backoff from 5 ms to 1,000 s, as controller-runtime's.
	RateLimiter workqueue.TypedRateLimiter[T]
	// Metrics records each tenant's depth and wait; nil records nothing.
	Metrics *Metrics
	// IdleAfter is how long a tenant with nothing queued or in progress is remembered
	// (and its metric series kept) before it is forgotten. Default 10 minutes.
	IdleAfter time.Duration
	// PromoteAfter is how long a ready item waits behind higher priorities before it is
	// promoted to the highest. Default 1 minute.
	PromoteAfter time.Duration
	// Clock is for tests; default the real one.
	Clock clock.WithTicker
}

// DefaultPromoteAfter is PromoteAfter when not set: longer than a restart's first list
// takes to reach a worker on a quiet executor, short beside an action's timeout.
const DefaultPromoteAfter = time.Minute

// Queue is a fair work queue; it implements controller-runtime's
// priorityqueue.PriorityQueue. Make one with New.
type Queue[T comparable] struct {
	opts Options[T]

	mu   sync.Mutex
	cond *sync.Cond
	// items are the items queued: ready (in a tenant's lane), waiting for their time
	// (in waiting) or parked (added while in progress, placed at Done).
	items map[T]*entry[T]
	// inProgress are the items handed out and not yet Done.
	inProgress map[T]*tenant
	tenants    map[string]*tenant
	// levels holds, for each priority with ready items, the round of tenants; priorities
	// lists those priorities, highest first.
	levels     map[int]*level
	priorities []int
	ready      int
	waiting    waitHeap[T]
	shutdown   bool

	// wake tells the timer loop that the earliest waiting item changed.
	wake chan struct{}
	done chan struct{}
}

var _ priorityqueue.PriorityQueue[string] = (*Queue[string])(nil)

type entry[T comparable] struct {
	key      T
	tenant   *tenant
	priority int
	// readyAt is when a waiting item is due; zero once ready.
	readyAt time.Time
	// readySince is when the item became ready, for its wait.
	readySince time.Time
	// enteredAt is when it entered its priority's line, for its promotion.
	enteredAt time.Time
	// elem is the item's place in its tenant's lane while ready, age its place in its
	// priority's line by age.
	elem, age *list.Element
	// index is the item's place in the waiting heap, -1 when not in it.
	index  int
	parked bool
}

type tenant struct {
	name   string
	weight int
	// lanes hold the tenant's ready items by priority, in the order they became ready.
	lanes map[int]*list.List
	// held counts the tenant's items queued or in progress; at zero the tenant is idle.
	held      int
	ready     int
	idleSince time.Time
	stats     *tenantStats
}

// level is the round of the tenants with ready items at one priority.
type level struct {
	priority int
	round    *list.List // of *tenant
	places   map[*tenant]*list.Element
	// turn is the tenant being served, credit the items its turn has left.
	turn   *list.Element
	credit int
	// byAge holds the level's ready items of all tenants in the order they entered it,
	// oldest first: the front is the next to promote.
	byAge *list.List
}

// New makes a queue and starts its timer; ShutDown stops it.
func New[T comparable](opts Options[T]) *Queue[T] {
	if opts.RateLimiter == nil {
		opts.RateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[T](5*time.Millisecond, 1000*time.Second)
	}
	if opts.PromoteAfter <= 0 {
		opts.PromoteAfter = DefaultPromoteAfter
	}
	if opts.IdleAfter <= 0 {
		opts.IdleAfter = 10 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	q := &Queue[T]{
		opts:       opts,
		items:      map[T]*entry[T]{},
		inProgress: map[T]*tenant{},
		tenants:    map[string]*tenant{},
		levels:     map[int]*level{},
		wake:       make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	q.cond = sync.NewCond(&q.mu)
	go q.runTimer()
	return q
}

// Add queues an item, ready now.
func (q *Queue[T]) Add(item T) { q.AddWithOpts(priorityqueue.AddOpts{}, item) }

// AddAfter queues an item due after a delay.
func (q *Queue[T]) AddAfter(item T, after time.Duration) {
	q.AddWithOpts(priorityqueue.AddOpts{After: after}, item)
}

// AddRateLimited queues an item after its rate limiter's delay.
func (q *Queue[T]) AddRateLimited(item T) {
	q.AddWithOpts(priorityqueue.AddOpts{RateLimited: true}, item)
}

// AddWithOpts queues items, each once: an item already queued keeps the higher of the
// two priorities and the earlier of the two times it is due.
func (q *Queue[T]) AddWithOpts(o priorityqueue.AddOpts, items ...T) {
	priority := 0
	if o.Priority != nil {
		priority = *o.Priority
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown {
		return
	}
	now := q.opts.Clock.Now()
	for _, key := range items {
		after := o.After
		if o.RateLimited {
			if limited := q.opts.RateLimiter.When(key); after <= 0 || limited < after {
				after = limited
			}
		}
		var readyAt time.Time
		if after > 0 {
			readyAt = now.Add(after)
		}
		if e, ok := q.items[key]; ok {
			q.update(e, priority, readyAt, now)
			continue
		}
		t, inProgress := q.inProgress[key]
		if !inProgress {
			t = q.tenant(q.opts.TenantOf(key))
			t.held++
		}
		e := &entry[T]{key: key, tenant: t, priority: priority, readyAt: readyAt, index: -1}
		q.items[key] = e
		if inProgress {
			// Not handed out twice at once: placed when the one in progress is Done.
			e.parked = true
			continue
		}
		q.place(e, now)
	}
}

// update merges a new add into a queued item.
func (q *Queue[T]) update(e *entry[T], priority int, readyAt, now time.Time) {
	earlier := !e.readyAt.IsZero() && (readyAt.IsZero() || readyAt.Before(e.readyAt))
	higher := priority > e.priority
	if e.parked {
		if higher {
			e.priority = priority
		}
		if earlier {
			e.readyAt = readyAt
		}
		return
	}
	switch {
	case e.readyAt.IsZero():
		// Ready: a higher priority moves it to the back of that priority's line.
		if higher {
			q.unready(e)
			e.priority = priority
			q.makeReady(e, e.readySince, now)
		}
	case readyAt.IsZero():
		heap.Remove(&q.waiting, e.index)
		e.priority = max(e.priority, priority)
		e.readyAt = time.Time{}
		q.makeReady(e, now, now)
	default:
		if higher {
			e.priority = priority
		}
		if earlier {
			e.readyAt = readyAt
			heap.Fix(&q.waiting, e.index)
			q.poke()
		}
	}
}

// place puts an item in its tenant's lane if it is due, else among the waiting.
func (q *Queue[T]) place(e *entry[T], now time.Time) {
	e.parked = false
	if e.readyAt.IsZero() || !e.readyAt.After(now) {
		since := now
		if !e.readyAt.IsZero() {
			since = e.readyAt
		}
		e.readyAt = time.Time{}
		q.makeReady(e, since, now)
		return
	}
	heap.Push(&q.waiting, e)
	if e.index == 0 {
		q.poke()
	}
}

// makeReady appends an item to its tenant's lane at its priority, entering the tenant
// in that priority's round if it was not in it.
func (q *Queue[T]) makeReady(e *entry[T], since, now time.Time) {
	t := e.tenant
	lane := t.lanes[e.priority]
	if lane == nil {
		lane = list.New()
		t.lanes[e.priority] = lane
	}
	e.elem = lane.PushBack(e)
	e.readySince, e.enteredAt = since, now
	l := q.level(e.priority)
	if lane.Len() == 1 {
		l.enter(t)
	}
	e.age = l.byAge.PushBack(e)
	t.ready++
	q.ready++
	t.stats.depth(t.ready)
	q.cond.Signal()
}

// unready takes a ready item out of its lane.
func (q *Queue[T]) unready(e *entry[T]) {
	t := e.tenant
	lane := t.lanes[e.priority]
	lane.Remove(e.elem)
	q.levels[e.priority].byAge.Remove(e.age)
	e.elem, e.age = nil, nil
	if lane.Len() == 0 {
		delete(t.lanes, e.priority)
		q.leave(e.priority, t)
	}
	t.ready--
	q.ready--
	t.stats.depth(t.ready)
}

// level returns the round at a priority, making it if there is none.
func (q *Queue[T]) level(priority int) *level {
	if l, ok := q.levels[priority]; ok {
		return l
	}
	l := &level{priority: priority, round: list.New(), places: map[*tenant]*list.Element{}, byAge: list.New()}
	q.levels[priority] = l
	i, _ := slices.BinarySearchFunc(q.priorities, priority, func(a, b int) int { return cmp.Compare(b, a) })
	q.priorities = slices.Insert(q.priorities, i, priority)
	return l
}

// leave takes a tenant whose lane emptied out of a priority's round.
func (q *Queue[T]) leave(priority int, t *tenant) {
	l := q.levels[priority]
	l.leave(t)
	if l.round.Len() == 0 {
		delete(q.levels, priority)
		q.priorities = slices.DeleteFunc(q.priorities, func(p int) bool { return p == priority })
	}
}

// enter puts a tenant last in the round: the others with work are served first.
func (l *level) enter(t *tenant) {
	if l.turn != nil {
		l.places[t] = l.round.InsertBefore(t, l.turn)
		return
	}
	l.turn = l.round.PushBack(t)
	l.places[t] = l.turn
	l.credit = t.weight
}

func (l *level) leave(t *tenant) {
	place := l.places[t]
	delete(l.places, t)
	if place == l.turn {
		l.next()
	}
	l.round.Remove(place)
	if l.round.Len() == 0 {
		l.turn = nil
	}
}

// next passes the turn to the following tenant.
func (l *level) next() {
	if l.turn = l.turn.Next(); l.turn == nil {
		l.turn = l.round.Front()
	}
	if l.turn != nil {
		l.credit = l.turn.Value.(*tenant).weight
	}
}

// take hands out the next item: the tenant in turn at the highest priority, the front
// of its lane, once the items that waited long enough below were promoted.
func (q *Queue[T]) take(now time.Time) *entry[T] {
	q.promoteAged(now)
	l := q.levels[q.priorities[0]]
	if l.credit <= 0 {
		l.next()
	}
	t := l.turn.Value.(*tenant)
	e := t.lanes[l.priority].Front().Value.(*entry[T])
	l.credit--
	q.unready(e)
	return e
}

// promoteAged moves the items ready for PromoteAfter at a lower priority to the highest
// with work. Each level's line is in the order its items entered it, so only the fronts
// are looked at: a handful of levels per take, and each item moved once.
func (q *Queue[T]) promoteAged(now time.Time) {
	// From the lowest up: a level that empties shifts only those after it, done already.
	for i := len(q.priorities) - 1; i >= 1; i-- {
		for i < len(q.priorities) {
			l := q.levels[q.priorities[i]]
			e := l.byAge.Front().Value.(*entry[T])
			if now.Sub(e.enteredAt) < q.opts.PromoteAfter {
				break
			}
			q.unready(e)
			e.priority = q.priorities[0]
			q.makeReady(e, e.readySince, now)
			e.tenant.stats.promoted()
		}
	}
}

// GetWithPriority blocks until an item is ready or the queue shuts down, and hands the
// item out with its priority.
func (q *Queue[T]) GetWithPriority() (item T, priority int, shutdown bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.ready == 0 && !q.shutdown {
		q.cond.Wait()
	}
	if q.shutdown {
		return item, 0, true
	}
	now := q.opts.Clock.Now()
	e := q.take(now)
	delete(q.items, e.key)
	q.inProgress[e.key] = e.tenant
	e.tenant.stats.waited(now.Sub(e.readySince))
	return e.key, e.priority, false
}

// Get is GetWithPriority without the priority.
func (q *Queue[T]) Get() (item T, shutdown bool) {
	item, _, shutdown = q.GetWithPriority()
	return item, shutdown
}

// Done marks an item handed out as finished; if it was added again meanwhile, it is
// queued now.
func (q *Queue[T]) Done(item T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t, ok := q.inProgress[item]
	if !ok {
		return
	}
	delete(q.inProgress, item)
	now := q.opts.Clock.Now()
	if e, ok := q.items[item]; ok && e.parked {
		q.place(e, now)
		return
	}
	t.held--
	if t.held == 0 {
		t.idleSince = now
	}
}

// Forget clears an item's rate-limiter history.
func (q *Queue[T]) Forget(item T) { q.opts.RateLimiter.Forget(item) }

// NumRequeues is how often an item was rate limited since it was last forgotten.
func (q *Queue[T]) NumRequeues(item T) int { return q.opts.RateLimiter.NumRequeues(item) }

// Len is the number of items ready to be handed out.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ready
}

// ShutDown stops the queue: Get returns at once, adds are dropped.
func (q *Queue[T]) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.shutdown {
		return
	}
	q.shutdown = true
	close(q.done)
	q.cond.Broadcast()
}

// ShutDownWithDrain is ShutDown, as in controller-runtime's queue, which does not drain
// either.
func (q *Queue[T]) ShutDownWithDrain() { q.ShutDown() }

// ShuttingDown reports whether ShutDown was called.
func (q *Queue[T]) ShuttingDown() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.shutdown
}

// Tenants is the number of tenants the queue remembers: those with items queued or in
// progress, and those idle for less than IdleAfter.
func (q *Queue[T]) Tenants() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.tenants)
}

// tenant returns a tenant's state, making it if it is new.
func (q *Queue[T]) tenant(name string) *tenant {
	if t, ok := q.tenants[name]; ok {
		return t
	}
	weight := 1
	if q.opts.Weight != nil {
		weight = max(q.opts.Weight(name), 1)
	}
	t := &tenant{name: name, weight: weight, lanes: map[int]*list.List{}, stats: q.opts.Metrics.tenant(name)}
	q.tenants[name] = t
	return t
}

// poke wakes the timer loop: the earliest waiting item changed.
func (q *Queue[T]) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// runTimer moves waiting items to their lanes when due, and forgets idle tenants.
func (q *Queue[T]) runTimer() {
	sweep := q.opts.Clock.NewTicker(time.Minute)
	defer sweep.Stop()
	for {
		q.mu.Lock()
		now := q.opts.Clock.Now()
		next := q.promote(now)
		q.mu.Unlock()
		var timer clock.Timer
		var due <-chan time.Time
		if next > 0 {
			timer = q.opts.Clock.NewTimer(next)
			due = timer.C()
			// A timer counts from when it is set, not from now: a clock that moved
			// meanwhile (a fake one stepped, a pause of this goroutine) would have it fire
			// late by that much, or, for a fake clock, never. Past the deadline already,
			// go round at once.
			if !q.opts.Clock.Now().Before(now.Add(next)) {
				timer.Stop()
				continue
			}
		}
		select {
		case <-q.done:
		case <-q.wake:
		case <-due:
		case <-sweep.C():
			q.forgetIdle()
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-q.done:
			return
		default:
		}
	}
}

// promote readies the waiting items due by now and returns how long until the next is,
// zero when none waits.
func (q *Queue[T]) promote(now time.Time) time.Duration {
	for q.waiting.Len() > 0 {
		e := q.waiting[0]
		if e.readyAt.After(now) {
			return e.readyAt.Sub(now)
		}
		heap.Pop(&q.waiting)
		q.place(e, now)
	}
	return 0
}

// forgetIdle drops the tenants idle for longer than IdleAfter, so that a tenant seen
// once costs nothing after, however many come and go.
func (q *Queue[T]) forgetIdle() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.opts.Clock.Now()
	for name, t := range q.tenants {
		if t.held == 0 && now.Sub(t.idleSince) >= q.opts.IdleAfter {
			delete(q.tenants, name)
			q.opts.Metrics.forget(name)
		}
	}
}

// waitHeap orders waiting items by when they are due.
type waitHeap[T comparable] []*entry[T]

func (h waitHeap[T]) Len() int           { return len(h) }
func (h waitHeap[T]) Less(i, j int) bool { return h[i].readyAt.Before(h[j].readyAt) }
func (h waitHeap[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *waitHeap[T]) Push(x any) {
	e := x.(*entry[T])
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *waitHeap[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*h = old[:len(old)-1]
	return e
}
