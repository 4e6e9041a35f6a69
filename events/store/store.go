// Package store keeps action events and the latest state of each action in Postgres.
//
// Record writes a batch in one statement and one transaction: the events go into
// action_events (a redelivered event is absorbed by its primary key), and every action
// they touch is folded into the actions table, where a state is replaced only by a
// greater one (see Rank). Changed actions are announced with NOTIFY on NotifyChannel,
// delivered when the transaction commits, so watchers on every replica hear of them.
package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/postgres"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are the events service's schema migrations.
func Migrations() postgres.Migrations {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded directory is fixed at build time
	}
	return postgres.Migrations{Service: "events", FS: sub}
}

// NotifyChannel is the Postgres channel on which Record announces changed actions; the
// payload is the action's Key in its String form.
const NotifyChannel = "flyte_events_actions"

// ErrNotFound is returned when no event names the action.
var ErrNotFound = errors.New("action not found")

// Key identifies an action.
type Key struct {
	Project, Domain, Run, Action string
}

// KeyOf returns the key of an action identifier.
func KeyOf(id *flytecorev1.ActionIdentifier) Key {
	return Key{id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction()}
}

// String joins the parts with '/', which names never contain (they are DNS labels).
func (k Key) String() string {
	return k.Project + "/" + k.Domain + "/" + k.Run + "/" + k.Action
}

// ParseKey reverses Key.String.
func ParseKey(s string) (Key, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 {
		return Key{}, fmt.Errorf("store: malformed action key %q", s)
	}
	return Key{parts[0], parts[1], parts[2], parts[3]}, nil
}

// terminalRank is the rank shared by every terminal phase.
const terminalRank = 5

// Rank orders the phases of one attempt: non-terminal phases only move forward, so
// their rank is their number; every terminal phase outranks them all and they tie with
// each other (then version and occurred_at decide).
func Rank(phase flytecorev1.ActionPhase) int16 {
	if IsTerminal(phase) {
		return terminalRank
	}
	return int16(phase)
}

// IsTerminal reports whether an action in this phase is finished.
func IsTerminal(phase flytecorev1.ActionPhase) bool {
	switch phase {
	case flytecorev1.ActionPhase_ACTION_PHASE_SUCCEEDED, flytecorev1.ActionPhase_ACTION_PHASE_FAILED,
		flytecorev1.ActionPhase_ACTION_PHASE_ABORTED, flytecorev1.ActionPhase_ACTION_PHASE_TIMED_OUT:
		return true
	}
	return false
}

// Store reads and writes events and actions.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a store over a migrated database.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// RecordResult says what a batch added.
type RecordResult struct {
	// Recorded counts events that were new.
	Recorded int
	// Duplicates counts events already stored (or repeated within the batch).
	Duplicates int
	// Changed counts actions whose latest state moved.
	Changed int
}

// recordSQL records a batch in one statement. The batch arrives as parallel arrays;
// rows are taken in key order so that concurrent batches lock in the same order and
// cannot deadlock. Only events that were new take part in the fold.
const recordSQL = `
WITH batch AS (
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::text[],
        $5::integer[], $6::smallint[], $7::integer[], $8::smallint[],
        $9::timestamptz[], $10::bytea[], $11::bytea[]
    ) AS b(project, domain, run, action, attempt, phase, version, rank, occurred_at, event, state)
),
inserted AS (
    INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event)
    SELECT project, domain, run, action, attempt, phase, version, occurred_at, event
    FROM batch
    ORDER BY project, domain, run, action, attempt, phase, version
    ON CONFLICT DO NOTHING
    RETURNING project, domain, run, action, attempt, phase, version
),
winners AS (
    SELECT DISTINCT ON (b.project, b.domain, b.run, b.action)
           b.project, b.domain, b.run, b.action, b.attempt, b.phase, b.version, b.rank, b.occurred_at, b.state,
           min(b.occurred_at) OVER (PARTITION BY b.project, b.domain, b.run, b.action) AS created_at
    FROM batch b
    JOIN inserted i USING (project, domain, run, action, attempt, phase, version)
    ORDER BY b.project, b.domain, b.run, b.action,
             b.attempt DESC, b.rank DESC, b.version DESC, b.occurred_at DESC, b.phase DESC
),
upserted AS (
    INSERT INTO actions AS a (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, state)
    SELECT project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, state
    FROM winners
    ORDER BY project, domain, run, action
    ON CONFLICT (project, domain, run, action) DO UPDATE
    SET attempt = EXCLUDED.attempt, phase = EXCLUDED.phase, version = EXCLUDED.version,
        rank = EXCLUDED.rank, occurred_at = EXCLUDED.occurred_at, state = EXCLUDED.state
    WHERE (EXCLUDED.attempt, EXCLUDED.rank, EXCLUDED.version, EXCLUDED.occurred_at, EXCLUDED.phase)
        > (a.attempt, a.rank, a.version, a.occurred_at, a.phase)
    RETURNING project, domain, run, action
)
SELECT (SELECT count(*) FROM inserted),
       (SELECT count(pg_notify('` + NotifyChannel + `', project || '/' || domain || '/' || run || '/' || action)) FROM upserted)`

// Record stores a batch of validated events, all or nothing.
func (s *Store) Record(ctx context.Context, events []*eventsv1.ActionEvent) (RecordResult, error) {
	n := len(events)
	var (
		projects, domains, runs, actions = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		attempts, versions               = make([]int32, n), make([]int32, n)
		phases, ranks                    = make([]int16, n), make([]int16, n)
		occurred                         = make([]time.Time, n)
		encoded, states                  = make([][]byte, n), make([][]byte, n)
	)
	for i, ev := range events {
		id := ev.GetId()
		projects[i], domains[i], runs[i], actions[i] = id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction()
		attempts[i], versions[i] = int32(ev.GetAttempt()), int32(ev.GetVersion())
		phases[i], ranks[i] = int16(ev.GetPhase()), Rank(ev.GetPhase())
		occurred[i] = ev.GetOccurredAt().AsTime()
		var err error
		if encoded[i], err = proto.Marshal(ev); err != nil {
			return RecordResult{}, fmt.Errorf("store: encoding event %d: %w", i, err)
		}
		if states[i], err = proto.Marshal(stateOf(ev)); err != nil {
			return RecordResult{}, fmt.Errorf("store: encoding state of event %d: %w", i, err)
		}
	}
	var recorded, changed int
	err := s.pool.QueryRow(ctx, recordSQL, projects, domains, runs, actions,
		attempts, phases, versions, ranks, occurred, encoded, states).Scan(&recorded, &changed)
	if err != nil {
		return RecordResult{}, fmt.Errorf("store: recording %d events: %w", n, err)
	}
	return RecordResult{Recorded: recorded, Duplicates: n - recorded, Changed: changed}, nil
}

// stateOf is the action's state if this event wins the fold; created_at is filled in
// when the state is read.
func stateOf(ev *eventsv1.ActionEvent) *eventsv1.Action {
	return &eventsv1.Action{
		Id:          ev.GetId(),
		Attempt:     ev.GetAttempt(),
		Phase:       ev.GetPhase(),
		Version:     ev.GetVersion(),
		Error:       ev.GetError(),
		CacheStatus: ev.GetCacheStatus(),
		OutputsUri:  ev.GetOutputsUri(),
		Reason:      ev.GetReason(),
		Message:     ev.GetMessage(),
		Cluster:     ev.GetCluster(),
		TaskType:    ev.GetTaskType(),
		UpdatedAt:   ev.GetOccurredAt(),
	}
}

func decodeAction(state []byte, createdAt time.Time) (*eventsv1.Action, error) {
	var a eventsv1.Action
	if err := proto.Unmarshal(state, &a); err != nil {
		return nil, fmt.Errorf("store: decoding action state: %w", err)
	}
	a.CreatedAt = timestamppb.New(createdAt)
	return &a, nil
}

// GetAction returns the latest state of one action, or ErrNotFound.
func (s *Store) GetAction(ctx context.Context, key Key) (*eventsv1.Action, error) {
	var (
		state     []byte
		createdAt time.Time
	)
	err := s.pool.QueryRow(ctx,
		`SELECT state, created_at FROM actions WHERE project = $1 AND domain = $2 AND run = $3 AND action = $4`,
		key.Project, key.Domain, key.Run, key.Action).Scan(&state, &createdAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: reading action %s: %w", key, err)
	}
	return decodeAction(state, createdAt)
}

// ActionFilter selects actions to list.
type ActionFilter struct {
	Project, Domain string
	// Run narrows to one run when not empty.
	Run string
	// Phase narrows to one phase when not unspecified.
	Phase flytecorev1.ActionPhase
}

// ListedAction is an action with its listing position.
type ListedAction struct {
	// Cursor is the action's position; pass it as after to continue after it.
	Cursor int64
	Action *eventsv1.Action
}

// ListActions returns up to limit actions matching f, newest first, after the cursor
// (0 starts at the newest).
func (s *Store) ListActions(ctx context.Context, f ActionFilter, after int64, limit int) ([]ListedAction, error) {
	// The query is built per filter combination so that each gets its own index plan;
	// "($3 = '' OR run = $3)" would defeat the indexes.
	var q strings.Builder
	q.WriteString(`SELECT id, state, created_at FROM actions WHERE project = $1 AND domain = $2`)
	args := []any{f.Project, f.Domain}
	if f.Run != "" {
		args = append(args, f.Run)
		fmt.Fprintf(&q, " AND run = $%d", len(args))
	}
	if f.Phase != flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED {
		args = append(args, int16(f.Phase))
		fmt.Fprintf(&q, " AND phase = $%d", len(args))
	}
	if after > 0 {
		args = append(args, after)
		fmt.Fprintf(&q, " AND id < $%d", len(args))
	}
	args = append(args, limit)
	fmt.Fprintf(&q, " ORDER BY id DESC LIMIT $%d", len(args))

	rows, err := s.pool.Query(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("store: listing actions: %w", err)
	}
	var (
		out       []ListedAction
		id        int64
		state     []byte
		createdAt time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &createdAt}, func() error {
		a, err := decodeAction(state, createdAt)
		if err != nil {
			return err
		}
		out = append(out, ListedAction{Cursor: id, Action: a})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: listing actions: %w", err)
	}
	return out, nil
}

// EventCursor is an event's position in its action's history.
type EventCursor struct {
	Attempt    uint32
	OccurredAt time.Time
	Phase      int16
	Version    uint32
}

// ListedEvent is an event with its position.
type ListedEvent struct {
	Cursor EventCursor
	Event  *eventsv1.ActionEvent
}

// ListActionEvents returns up to limit events of one action in order of attempt,
// occurrence, phase and version, after the cursor (the zero cursor starts at the first).
func (s *Store) ListActionEvents(ctx context.Context, key Key, after EventCursor, limit int) ([]ListedEvent, error) {
	rows, err := s.pool.Query(ctx, `
SELECT attempt, occurred_at, phase, version, event FROM action_events
WHERE project = $1 AND domain = $2 AND run = $3 AND action = $4
  AND (attempt, occurred_at, phase, version) > ($5, $6, $7, $8)
ORDER BY attempt, occurred_at, phase, version
LIMIT $9`,
		key.Project, key.Domain, key.Run, key.Action,
		int32(after.Attempt), after.OccurredAt, after.Phase, int32(after.Version), limit)
	if err != nil {
		return nil, fmt.Errorf("store: listing events of %s: %w", key, err)
	}
	var (
		out     []ListedEvent
		c       EventCursor
		attempt int32
		version int32
		encoded []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&attempt, &c.OccurredAt, &c.Phase, &version, &encoded}, func() error {
		var ev eventsv1.ActionEvent
		if err := proto.Unmarshal(encoded, &ev); err != nil {
			return fmt.Errorf("decoding event: %w", err)
		}
		c.Attempt, c.Version = uint32(attempt), uint32(version)
		out = append(out, ListedEvent{Cursor: c, Event: &ev})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: listing events of %s: %w", key, err)
	}
	return out, nil
}

// ActionsByKey returns the current state of the named actions that exist.
func (s *Store) ActionsByKey(ctx context.Context, keys []Key) ([]*eventsv1.Action, error) {
	n := len(keys)
	projects, domains, runs, actions := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, k := range keys {
		projects[i], domains[i], runs[i], actions[i] = k.Project, k.Domain, k.Run, k.Action
	}
	rows, err := s.pool.Query(ctx, `
SELECT a.state, a.created_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(project, domain, run, action)
JOIN actions a USING (project, domain, run, action)`, projects, domains, runs, actions)
	if err != nil {
		return nil, fmt.Errorf("store: reading %d actions: %w", n, err)
	}
	var (
		out       []*eventsv1.Action
		state     []byte
		createdAt time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&state, &createdAt}, func() error {
		a, err := decodeAction(state, createdAt)
		if err != nil {
			return err
		}
		out = append(out, a)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: reading %d actions: %w", n, err)
	}
	return out, nil
}

// DeleteFinished deletes up to limit actions that finished before cutoff, with their
// events, and returns how many actions went. Small batches keep each transaction short.
func (s *Store) DeleteFinished(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `
WITH doomed AS (
    SELECT project, domain, run, action FROM actions
    WHERE rank = 5 AND occurred_at < $1
    ORDER BY occurred_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
gone_events AS (
    DELETE FROM action_events e USING doomed d
    WHERE e.project = d.project AND e.domain = d.domain AND e.run = d.run AND e.action = d.action
),
gone AS (
    DELETE FROM actions a USING doomed d
    WHERE a.project = d.project AND a.domain = d.domain AND a.run = d.run AND a.action = d.action
    RETURNING 1
)
SELECT count(*) FROM gone`, cutoff, limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: deleting finished actions: %w", err)
	}
	return n, nil
}
