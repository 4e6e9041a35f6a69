package store

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ResyncPayload is a notification that says announcements were lost: a watcher that
// hears it can no longer trust its view and must re-list.
const ResyncPayload = "resync"

// maxPendingKeys bounds the changed actions waiting to be announced while Postgres
// refuses the notifications; beyond it they are dropped, and the next notification that
// goes through is ResyncPayload.
const maxPendingKeys = 1 << 16

// notifier announces changed actions after their transactions commit, when
// Options.NotifyAfterCommit asks for it; by default Record notifies inside its
// transaction instead, so that a crash cannot separate a commit from its announcement.
//
// A NOTIFY inside Record's transaction would hold Postgres's notification lock, which
// is global to the cluster, from the moment it queues to the end of the commit, the
// flush of the WAL included: every Record would then commit one after another, without
// group commit. So Record only hands its changed actions here; one sender at a time
// takes all that is waiting and announces it in a transaction of its own, so the lock
// is taken once per round however many Records it covers. `events-bench --only notify`
// measures the two ways (docs/benchmarks.md).
//
// The cost is that a process that dies between a commit and the next round leaves that
// round's actions unannounced: watchers on other replicas see those changes only with
// their next one, or when they re-list. A round is one round trip.
type notifier struct {
	pool *pgxpool.Pool

	mu      sync.Mutex
	pending []Key
	sending bool
	lost    bool // keys were dropped: the next round starts with ResyncPayload
}

func newNotifier(pool *pgxpool.Pool) *notifier {
	return &notifier{pool: pool}
}

// announce queues keys and starts a sender when none runs.
func (n *notifier) announce(keys []Key) {
	if len(keys) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.pending)+len(keys) > maxPendingKeys {
		n.pending, n.lost = nil, true
	} else {
		n.pending = append(n.pending, keys...)
	}
	if !n.sending {
		n.sending = true
		go n.send()
	}
}

// send announces what is pending, round after round, until nothing is. A round that
// fails is retried twice; then its keys are dropped for a resync, and the sender stops,
// so that one that cannot reach Postgres (or outlived its pool) does not spin: the next
// announce starts another, whose first notification is the resync.
func (n *notifier) send() {
	for failures := 0; ; {
		n.mu.Lock()
		keys, lost := n.pending, n.lost
		n.pending, n.lost = nil, false
		if len(keys) == 0 && !lost {
			n.stopLocked()
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()

		err := n.round(keys, lost)
		if err == nil {
			failures = 0
			continue
		}
		failures++
		n.mu.Lock()
		if failures == 3 || len(n.pending)+len(keys) > maxPendingKeys {
			n.pending, n.lost = nil, true
			n.stopLocked()
			n.mu.Unlock()
			return
		}
		n.pending = append(keys, n.pending...)
		n.lost = n.lost || lost
		n.mu.Unlock()
		time.Sleep(time.Duration(failures) * 100 * time.Millisecond)
	}
}

// stopLocked marks the sender stopped.
func (n *notifier) stopLocked() { n.sending = false }

// round sends keys (after ResyncPayload when lost) in one transaction.
func (n *notifier) round(keys []Key, lost bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := n.pool.Exec(ctx, notifySQL, NotifyChannel, payloadsOf(keys, lost))
	return err
}

// notifySQL sends each of $2 as a notification on $1.
const notifySQL = "SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p"

// payloadsOf joins keys into notifications of at most keysPerNotification keys, after
// ResyncPayload when lost.
func payloadsOf(keys []Key, lost bool) []string {
	payloads := make([]string, 0, 2+len(keys)/keysPerNotification)
	if lost {
		payloads = append(payloads, ResyncPayload)
	}
	var b strings.Builder
	for i, k := range keys {
		if i%keysPerNotification != 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k.String())
		if i%keysPerNotification == keysPerNotification-1 || i == len(keys)-1 {
			payloads = append(payloads, b.String())
			b.Reset()
		}
	}
	return payloads
}
