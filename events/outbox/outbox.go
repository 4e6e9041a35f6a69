// Package outbox is the storage side of CloudEvents egress: a transactional outbox in
// the events database.
//
// A trigger on action_events (migration 00002_outbox.sql) queues every newly stored
// event in event_outbox, in the transaction that records it, while at least one sink is
// registered; a redelivered duplicate is never queued. A Record's events share one row,
// so the outbox costs Record little; an entry is one event of a row. Each sink has its
// own cursor:
// Read returns the entries after it, Advance moves it, and Trim deletes what every sink
// has passed, so a slow sink holds up neither another sink nor Record. Entries a sink
// refuses for good become dead letters, which can be listed and replayed. One relay at a
// time works the outbox; TryLead elects it.
package outbox

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/internal/textbound"
	"github.com/flytekube/backend/services/postgres"
)

// The outbox's statements, one file each in queries/, where they are explained.
var (
	//go:embed queries/register_sinks.sql
	registerSinksSQL string
	//go:embed queries/add_sinks.sql
	addSinksSQL string
	//go:embed queries/unregister_sinks.sql
	unregisterSinksSQL string
	//go:embed queries/rename_sink.sql
	renameSinkSQL string
	//go:embed queries/read.sql
	readSQL string
	//go:embed queries/advance.sql
	advanceSQL string
	//go:embed queries/trim.sql
	trimSQL string
	//go:embed queries/lag.sql
	lagSQL string
)

// ErrUnknownSink is returned for a sink that is not registered.
var ErrUnknownSink = errors.New("outbox: unknown sink")

// Outbox reads and keeps the outbox of a migrated events database.
type Outbox struct {
	pool *pgxpool.Pool
}

// New returns the outbox of the database pool reaches (migrated with store.Migrations).
func New(pool *pgxpool.Pool) *Outbox { return &Outbox{pool: pool} }

// Position is an event's place in the outbox: its row's transaction id and position
// (one row per statement that recorded events), then its ordinal among the row's
// events, from 1. Events are read, and cursors move, in this order.
type Position struct {
	Tx      uint64
	Pos     int64
	Ordinal int32
}

// Compare returns -1, 0 or +1 as p is before, at or after o.
func (p Position) Compare(o Position) int {
	return cmp.Or(cmp.Compare(p.Tx, o.Tx), cmp.Compare(p.Pos, o.Pos), cmp.Compare(p.Ordinal, o.Ordinal))
}

func (p Position) String() string { return fmt.Sprintf("%d/%d/%d", p.Tx, p.Pos, p.Ordinal) }

// Entry is one queued event.
type Entry struct {
	Position Position
	// Key, Attempt, Phase, Version and OccurredAt are the event's, read from it (zero
	// when it does not decode).
	Key        store.Key
	Attempt    uint32
	Phase      flytecorev1.ActionPhase
	Version    uint32
	OccurredAt time.Time
	// RecordedAt is when the transaction that recorded the event began.
	RecordedAt time.Time
	// Event is the event itself; nil when its stored bytes do not decode (DecodeErr says
	// why), which a relay should treat as a refusal, so the entry becomes a dead letter
	// instead of stopping its sink.
	Event     *eventsv1.ActionEvent
	DecodeErr error
	// encoded is the event as stored, kept for a dead letter.
	encoded []byte
}

// decode reads the stored event and the fields that come from it.
func (e *Entry) decode() {
	var ev eventsv1.ActionEvent
	// As the store reads events: unknown fields of rows stored before they were dropped on
	// the way in are not passed on.
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(e.encoded, &ev); err != nil {
		e.DecodeErr = fmt.Errorf("outbox: decoding the event at %s: %w", e.Position, err)
		return
	}
	e.Event = &ev
	e.Key = store.KeyOf(ev.GetId())
	e.Attempt, e.Phase, e.Version = ev.GetAttempt(), ev.GetPhase(), ev.GetVersion()
	if ev.GetOccurredAt() != nil {
		e.OccurredAt = ev.GetOccurredAt().AsTime()
	}
}

// SinkChanges says what RegisterSinks changed.
type SinkChanges struct {
	// Added are the sinks registered now, at the current end of the outbox.
	Added []string
	// Removed are the sinks whose cursors were deleted, no replica having been
	// configured with them for the time RegisterSinks was given.
	Removed []string
}

// AddSinks registers each of names not yet registered, at the current end of the outbox,
// notes that a replica is configured with every one of them (see RegisterSinks), and
// unregisters nothing; it returns the names it added. A service runs it before it
// serves, so that every event it acknowledges is queued for the sinks it is configured
// with, whether or not its relay leads yet, and its relay again now and then.
func (o *Outbox) AddSinks(ctx context.Context, names []string) ([]string, error) {
	if err := checkSinkNames(names); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, nil
	}
	rows, err := o.pool.Query(ctx, addSinksSQL, pgx.StrictNamedArgs{"names": names})
	if err != nil {
		return nil, fmt.Errorf("outbox: adding sinks: %w", err)
	}
	var (
		added  []string
		name   string
		wasNew bool
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &wasNew}, func() error {
		if wasNew {
			added = append(added, name)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("outbox: adding sinks: %w", err)
	}
	return added, nil
}

// UnregisterSinks deletes the cursors of names, at once: the explicit step for sinks no
// replica is configured with any more (a replica still configured with one registers it
// again, at the then current end). Their dead letters stay. It returns the names it
// removed.
func (o *Outbox) UnregisterSinks(ctx context.Context, names []string) ([]string, error) {
	if err := checkSinkNames(names); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, nil
	}
	rows, err := o.pool.Query(ctx, unregisterSinksSQL, pgx.StrictNamedArgs{"names": names})
	if err != nil {
		return nil, fmt.Errorf("outbox: unregistering sinks: %w", err)
	}
	removed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("outbox: unregistering sinks: %w", err)
	}
	return removed, nil
}

// RenameSinks moves the cursor and the dead letters of each sink kept under an old name
// (a key of renames) to its new name (its value), in one transaction, keeping its place:
// a sink whose default name changed between releases goes on where it was. It reports
// how many cursors and dead letters it moved; a name with nothing kept is skipped.
func (o *Outbox) RenameSinks(ctx context.Context, renames map[string]string) (cursors, letters int64, err error) {
	for _, name := range renames {
		if err := checkSinkNames([]string{name}); err != nil {
			return 0, 0, err
		}
	}
	err = pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		for old, name := range renames {
			var c, l int64
			if err := tx.QueryRow(ctx, renameSinkSQL, pgx.StrictNamedArgs{"old": old, "new": name}).Scan(&c, &l); err != nil {
				return err
			}
			cursors, letters = cursors+c, letters+l
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: renaming sinks: %w", err)
	}
	return cursors, letters, nil
}

func checkSinkNames(names []string) error {
	for _, n := range names {
		if n == "" {
			return errors.New("outbox: a sink's name is empty")
		}
		if p := postgres.TextProblem(n); p != "" {
			return fmt.Errorf("outbox: sink name %q is %s", n, p)
		}
	}
	return nil
}

// RegisterSinks is the relay leader's registration of the sinks it is configured with:
// a new name gets a cursor at the current end of the outbox (it gets the events recorded
// from then on), a registered name keeps its cursor, and every name is noted as
// configured now. The cursor of a sink not among names is kept while any replica has
// noted it configured within forgetAfter (0: for ever): a leader of an older
// configuration must not drop the cursor of a sink a rollout is adding. Past that, it is
// deleted, so that a sink taken out of the configuration no longer holds trimming back;
// its dead letters stay. Once no sink is registered, nothing is queued.
func (o *Outbox) RegisterSinks(ctx context.Context, names []string, forgetAfter time.Duration) (SinkChanges, error) {
	if err := checkSinkNames(names); err != nil {
		return SinkChanges{}, err
	}
	if names == nil {
		names = []string{} // NULL would make "<> ALL" unknown and remove nothing
	}
	var forget any // NULL keeps every cursor
	if forgetAfter > 0 {
		forget = forgetAfter
	}
	rows, err := o.pool.Query(ctx, registerSinksSQL, pgx.StrictNamedArgs{"names": names, "forget_after": forget})
	if err != nil {
		return SinkChanges{}, fmt.Errorf("outbox: registering sinks: %w", err)
	}
	var (
		changes SinkChanges
		added   bool
		name    string
	)
	_, err = pgx.ForEachRow(rows, []any{&added, &name}, func() error {
		if added {
			changes.Added = append(changes.Added, name)
		} else {
			changes.Removed = append(changes.Removed, name)
		}
		return nil
	})
	if err != nil {
		return SinkChanges{}, fmt.Errorf("outbox: registering sinks: %w", err)
	}
	return changes, nil
}

// Read returns up to limit entries after sink's cursor, in position order, of
// transactions that have ended (queries/read.sql says why), or ErrUnknownSink.
func (o *Outbox) Read(ctx context.Context, sink string, limit int) ([]Entry, error) {
	if limit < 1 {
		return nil, fmt.Errorf("outbox: reading %d entries: the limit must be positive", limit)
	}
	rows, err := o.pool.Query(ctx, readSQL, pgx.StrictNamedArgs{"sink": sink, "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("outbox: reading for sink %q: %w", sink, err)
	}
	var (
		out       []Entry
		sinkFound bool
		tx        *uint64
		pos       *int64
		ordinal   *int32
		recorded  *time.Time
		encoded   []byte
	)
	// The sink's row comes back with NULL columns when nothing is pending.
	_, err = pgx.ForEachRow(rows, []any{&tx, &pos, &ordinal, &recorded, &encoded}, func() error {
		sinkFound = true
		if tx == nil {
			return nil
		}
		e := Entry{Position: Position{*tx, *pos, *ordinal}, RecordedAt: *recorded, encoded: encoded}
		e.decode()
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: reading for sink %q: %w", sink, err)
	}
	if !sinkFound {
		return nil, fmt.Errorf("%w %q", ErrUnknownSink, sink)
	}
	return out, nil
}

// Advance moves sink's cursor to to, the position of the last entry the sink has
// handled. It never moves a cursor backwards: an older position leaves it where it is.
func (o *Outbox) Advance(ctx context.Context, sink string, to Position) error {
	tag, err := o.pool.Exec(ctx, advanceSQL, pgx.StrictNamedArgs{"sink": sink, "tx": to.Tx, "position": to.Pos, "ordinal": to.Ordinal})
	if err != nil {
		return fmt.Errorf("outbox: advancing sink %q to %s: %w", sink, to, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w %q", ErrUnknownSink, sink)
	}
	return nil
}

// Trim deletes the outbox rows whose events every registered sink has passed (every row
// when no sink is registered), batch rows to a statement and a transaction, until none
// is left, and returns how many rows went.
func (o *Outbox) Trim(ctx context.Context, batch int) (int, error) {
	if batch < 1 {
		return 0, fmt.Errorf("outbox: trimming in batches of %d: the batch must be positive", batch)
	}
	total := 0
	for {
		tag, err := o.pool.Exec(ctx, trimSQL, pgx.StrictNamedArgs{"batch": batch})
		if err != nil {
			return total, fmt.Errorf("outbox: trimming: %w", err)
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// LagRowsCap bounds the outbox rows Lag reads: past it, a sink is far behind, and
// counting further would cost each call a walk over the whole backlog.
const LagRowsCap = 10_000

// Lag says how far sink is behind: the events after its cursor, counted in the
// LagRowsCap first rows (one per Record that queued events, so the count is exact up to
// at least that many events), and the earliest time one of those rows was recorded
// (zero when nothing is pending). Events of committed transactions that Read holds back
// because an older transaction is still open count too. It reads the rows' counts, not
// their events: 10 ms for 5,400 rows on the benchmark machine.
func (o *Outbox) Lag(ctx context.Context, sink string) (events int64, oldest time.Time, err error) {
	var min *time.Time
	err = o.pool.QueryRow(ctx, lagSQL, pgx.StrictNamedArgs{"sink": sink, "cap": LagRowsCap}).Scan(&events, &min)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, fmt.Errorf("%w %q", ErrUnknownSink, sink)
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("outbox: measuring the lag of sink %q: %w", sink, err)
	}
	if min != nil {
		oldest = *min
	}
	return events, oldest, nil
}

// MaxDetailBytes bounds a dead letter's detail.
const MaxDetailBytes = 2 << 10

// boundDetail makes s fit a dead letter: valid UTF-8 without NUL bytes (text holds
// neither), at most MaxDetailBytes, cut at a character boundary and marked there.
func boundDetail(s string) string { return textbound.Fit(s, MaxDetailBytes) }
