// Package store keeps action events and the latest state of each action in Postgres.
//
// Record writes a batch in one statement and one transaction: the events go into
// action_events (a redelivered event is absorbed by its primary key), and every action
// they touch is folded into the actions table, where a state is replaced only by a
// greater one (see Rank). Changed actions are announced with NOTIFY on NotifyChannel,
// several to a notification, within the same transaction, so watchers on every replica
// hear of them exactly when the change commits. action_events is partitioned by filing time, so that retention
// drops partitions (partitions.go).
package store

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/postgres"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are the events service's schema migrations.
func Migrations() postgres.Migrations {
	return postgres.EmbeddedMigrations(postgres.ServiceEvents, migrationFiles, "migrations")
}

// NotifyChannel is the Postgres channel on which Record announces changed actions; the
// payload is one or more action keys in their String form, separated by newlines
// (ParseKeys reads it). A batch announces its actions in as few notifications as fit
// Postgres's payload limit, rather than one per action.
const NotifyChannel = "flyte_events_actions"

// keysPerNotification bounds the keys in one notification: a key is at most four
// 63-character names and three separators, and 31 of them with their newlines stay under
// Postgres's 8000-byte payload limit.
const keysPerNotification = 31

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

// ParseKeys reads a notification's payload: keys separated by newlines.
func ParseKeys(payload string) ([]Key, error) {
	var keys []Key
	for line := range strings.SplitSeq(payload, "\n") {
		k, err := parseKey(line)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// parseKey reverses Key.String.
func parseKey(s string) (Key, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 {
		return Key{}, fmt.Errorf("store: malformed action key %q", s)
	}
	return Key{parts[0], parts[1], parts[2], parts[3]}, nil
}

// terminalRank is the rank shared by every terminal phase.
const terminalRank = 5

// unnamedRank is the rank of a phase this release does not name: below every phase it
// does (the unspecified phase is never stored).
const unnamedRank = -1

// Rank orders the phases of one attempt: non-terminal phases only move forward, so
// their rank is their number; every terminal phase outranks them all and they tie with
// each other (then version and occurred_at decide).
//
// A phase this release does not name (a newer executor's, sent to a replica older than
// it) ranks below every phase it names. The replica cannot know where the phase stands
// in an attempt's progress nor whether it ends the action: ranked by its number it would
// outrank Succeeded and hold the action there for good when a newer non-terminal phase
// came before the end. Ranked lowest, it is stored and listed like any event, is the
// action's latest state only while nothing this release knows of its attempt (or a later
// one) is stored, and never replaces a phase this release knows, so what the replica
// serves among those is what it always served. The cost: a newer phase that ends an
// action shows on such a replica as the known phase before it.
func Rank(phase flytecorev1.ActionPhase) int16 {
	switch {
	case IsTerminal(phase):
		return terminalRank
	case !IsNamed(phase):
		return unnamedRank
	}
	return int16(phase)
}

// IsNamed reports whether this release's schema names the phase (the unspecified phase
// aside).
func IsNamed(phase flytecorev1.ActionPhase) bool {
	_, ok := flytecorev1.ActionPhase_name[int32(phase)]
	return ok && phase != flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED
}

// IsTerminal reports whether an action in this phase is finished: the one rule of it for
// the contract's phases, for Rank and for whatever else reads them (the sandbox, the
// chaos and upgrade checks). The CRD's phases have theirs, flytev1.Phase.IsTerminal;
// the test of eventsink.ProtoPhase holds the two to agreeing.
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
	pool     *pgxpool.Pool
	opts     Options
	notifier *notifier
	// newestTo is the end of the newest partition seen, in Unix microseconds (0: none
	// seen yet); see filingTime.
	newestTo atomic.Int64
}

// Options tune a store; the zero value takes the defaults.
type Options struct {
	// PartitionWidth is the span of filing times one partition of action_events holds
	// (DefaultPartitionWidth); retention keeps an action's history at most this much
	// beyond its TTL.
	PartitionWidth time.Duration
	// PartitionsAhead is how many partitions beyond the present's MaintainPartitions
	// keeps ready (DefaultPartitionsAhead).
	PartitionsAhead int
	// UnfinishedTTL is how long retention keeps an unfinished action after its newest
	// state occurred (zero: DefaultUnfinishedTTLFactor times the TTL DropExpired is given;
	// never less than that TTL and a partition's width): past it, the action is taken
	// for abandoned, and dropped with its events when retention reaches its partition.
	UnfinishedTTL time.Duration
	// Clock gives Record its filing times (tests move it).
	Clock clock.PassiveClock
	// NotifyAfterCommit announces changes after Record's transaction commits, through
	// the notifier (notifier.go), as the store once did: faster under many concurrent
	// Records, but a replica that dies between the commit and the announcement leaves
	// the change unannounced. The benchmark compares the two ways.
	NotifyAfterCommit bool
}

// New returns a store over a migrated database.
func New(pool *pgxpool.Pool, opts ...Options) *Store {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.PartitionWidth <= 0 {
		o.PartitionWidth = DefaultPartitionWidth
	}
	if o.PartitionsAhead <= 0 {
		o.PartitionsAhead = DefaultPartitionsAhead
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Store{pool: pool, opts: o, notifier: newNotifier(pool)}
}

// RecordResult says what a batch added.
type RecordResult struct {
	// Recorded counts events that were new.
	Recorded int
	// Duplicates counts events already stored (or repeated within the batch).
	Duplicates int
	// Changed counts actions whose latest state moved.
	Changed int
	// Confirmed counts actions the batch left as they were but whose latest state is
	// one of its events (a redelivery): they are announced again, so that watchers
	// converge even when the first announcement was lost with its replica.
	Confirmed int
}

// The store's statements, one file each in queries/, where they are explained.
var (
	//go:embed queries/fold.sql
	foldSQL string
	//go:embed queries/insert_events.sql
	insertEventsSQL string
	//go:embed queries/get_action.sql
	getActionSQL string
	//go:embed queries/list_actions.sql
	listActionsSQL string
	//go:embed queries/list_action_events.sql
	listActionEventsSQL string
	//go:embed queries/actions_by_key.sql
	actionsByKeySQL string
	//go:embed queries/filings.sql
	filingsSQL string
	//go:embed queries/clusters_of.sql
	clustersOfSQL string
)

var eventColumns = []string{"project", "domain", "run", "action", "attempt", "phase", "version", "occurred_at", "event", "filed_at", "cluster"}

// row is one event ready for the database.
type row struct {
	key Key
	// cluster is the event's: with the key, it names the action, so that two clusters'
	// actions of one name are two actions.
	cluster  string
	fold     foldKey
	encoded  []byte
	occurred time.Time
}

// foldKey orders the states of one action; it mirrors the tuple comparison in fold.sql.
type foldKey struct {
	attempt  int32
	rank     int16
	version  int32
	occurred time.Time // truncated to the database's microseconds
	phase    int16
}

func (k foldKey) compare(o foldKey) int {
	return cmp.Or(
		cmp.Compare(k.attempt, o.attempt),
		cmp.Compare(k.rank, o.rank),
		cmp.Compare(k.version, o.version),
		k.occurred.Compare(o.occurred),
		cmp.Compare(k.phase, o.phase),
	)
}

func (k Key) compare(o Key) int {
	return cmp.Or(
		strings.Compare(k.Project, o.Project), strings.Compare(k.Domain, o.Domain),
		strings.Compare(k.Run, o.Run), strings.Compare(k.Action, o.Action),
	)
}

// sameAction reports whether two rows are events of one action: one name, one cluster.
func (r row) sameAction(o row) bool {
	return r.key == o.key && r.cluster == o.cluster
}

// Record stores a batch of validated events, all or nothing. An event the store cannot
// hold faithfully fails the batch with an *InvalidEventError. An action is its name and
// its cluster: two clusters' actions of one name are two actions. Fields and enum values the schema does not
// name (a newer executor's) are stored with the event, as sent.
//
// Each action the batch touches is folded first (fold.sql), which files a new action and
// locks an existing one, so its events then go to its partition. New events, the common
// case, are then copied in with COPY, the fastest way into Postgres. When the copy finds
// an event already stored (a redelivery), the transaction is rolled back and another
// folds again and inserts the events with insert_events.sql, which absorbs what is
// already there. The fold's winners are chosen among all of the batch's events: a
// redelivered event was folded when it was first recorded, so the conditional upsert
// finds it no greater than the stored state.
//
// The changed actions, and those whose latest state a redelivered event of the batch
// confirms, are announced on NotifyChannel within the same transaction: Postgres
// delivers a transaction's notifications when it commits, atomically with it, so no
// crash can leave a committed change unannounced. That costs some throughput under many
// concurrent Records (Postgres takes a global lock for notifying commits;
// docs/benchmarks.md measures it); Options.NotifyAfterCommit trades it back.
func (s *Store) Record(ctx context.Context, events []*eventsv1.ActionEvent) (RecordResult, error) {
	rows, err := prepare(events)
	if err != nil {
		return RecordResult{}, err
	}
	unique := dedupe(rows) // a repeat inside the batch would fail the copy
	winners, created := fold(rows)
	b := &batch{rows: unique, winners: winners, created: created, filedAt: s.filingTime()}

	var f folded
	madePartitions := false
	for {
		f, err = s.copyAndFold(ctx, b)
		recorded := len(unique)
		if isUniqueViolation(err) {
			recorded, f, err = s.insertAndFold(ctx, b)
		}
		if isNoPartition(err) && !madePartitions {
			madePartitions = true
			// Maintenance is behind (or never ran against this database): make the
			// partitions and try once more.
			if _, merr := s.maintainPartitions(ctx, s.opts.Clock.Now(), true); merr != nil {
				return RecordResult{}, fmt.Errorf("store: recording %d events: %w (making partitions: %w)", len(events), err, merr)
			}
			b.filedAt = s.filingTime()
			continue
		}
		if err != nil {
			return RecordResult{}, fmt.Errorf("store: recording %d events: %w", len(events), err)
		}
		if s.opts.NotifyAfterCommit {
			s.notifier.announce(winners.keysAt(f.announced()))
		}
		return RecordResult{Recorded: recorded, Duplicates: len(events) - recorded, Changed: len(f.changed), Confirmed: len(f.confirmed)}, nil
	}
}

// batch is one Record's rows, folded.
type batch struct {
	rows    []row // deduplicated, in key order
	winners *columns
	created []time.Time
	// filedAt files the batch's new actions.
	filedAt time.Time
}

func (s *Store) copyAndFold(ctx context.Context, b *batch) (f folded, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if f, err = foldInto(ctx, tx, b); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"action_events"}, eventColumns, copySource(b.rows, f.filings)); err != nil {
			return err
		}
		return s.notifyInTransaction(ctx, tx, b, f)
	})
	return f, err
}

// notifyInTransaction announces the changed and confirmed actions within tx, unless the
// options leave it to after commit.
func (s *Store) notifyInTransaction(ctx context.Context, tx pgx.Tx, b *batch, f folded) error {
	ords := f.announced()
	if s.opts.NotifyAfterCommit || len(ords) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, notifySQL, NotifyChannel, payloadsOf(b.winners.keysAt(ords), false))
	return err
}

func (s *Store) insertAndFold(ctx context.Context, b *batch) (recorded int, f folded, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if f, err = foldInto(ctx, tx, b); err != nil {
			return err
		}
		filings := f.filings
		ev := newColumns(len(b.rows))
		filed := make([]pgtype.Timestamptz, 0, len(b.rows))
		eachAction(b.rows, func(i, action int) {
			ev.add(b.rows[i])
			filed = append(filed, filings[action])
		})
		tag, err := tx.Exec(ctx, insertEventsSQL,
			ev.projects, ev.domains, ev.runs, ev.actions, ev.attempts, ev.phases, ev.versions, ev.occurred, ev.encoded, filed, ev.clusters)
		if err != nil {
			return err
		}
		recorded = int(tag.RowsAffected())
		return s.notifyInTransaction(ctx, tx, b, f)
	})
	return recorded, f, err
}

// eachAction calls f with each row's index and the index of its action among the
// batch's (rows are in key order, as the winners are).
func eachAction(rows []row, f func(i, action int)) {
	action := -1
	for i, r := range rows {
		if i == 0 || !rows[i-1].sameAction(r) {
			action++
		}
		f(i, action)
	}
}

// folded is what the fold of a batch found, by the actions' places in it (from 1).
type folded struct {
	// changed are the actions whose state moved; confirmed those left as they were
	// whose state is the batch's winning event (a redelivery of it). Both are sorted.
	changed, confirmed []int64
	// filings are every action's filing.
	filings []pgtype.Timestamptz
}

// announced are the places of the actions Record announces: the changed and the
// confirmed, in order.
func (f folded) announced() []int64 {
	if len(f.confirmed) == 0 {
		return f.changed
	}
	return slices.Sorted(slices.Values(append(slices.Clip(f.changed), f.confirmed...)))
}

// foldInto runs fold.sql for the winners and each action's earliest occurrence, and
// returns what it found.
func foldInto(ctx context.Context, tx pgx.Tx, b *batch) (folded, error) {
	w := b.winners
	rows, err := tx.Query(ctx, foldSQL,
		w.projects, w.domains, w.runs, w.actions, w.attempts, w.phases,
		w.versions, w.ranks, w.occurred, b.created, w.encoded, b.filedAt, w.clusters,
	)
	if err != nil {
		return folded{}, err
	}
	// A filing may be -infinity (actions from before partitioning), which time.Time
	// cannot hold.
	f := folded{filings: make([]pgtype.Timestamptz, len(w.projects))}
	var (
		ord     int64
		filedAt pgtype.Timestamptz
	)
	if _, err := pgx.ForEachRow(rows, []any{&ord, &filedAt}, func() error {
		f.changed = append(f.changed, ord)
		f.filings[ord-1] = filedAt
		return nil
	}); err != nil {
		return folded{}, err
	}
	if len(f.changed) < len(f.filings) {
		if f.confirmed, err = unchangedFilings(ctx, tx, w, f.filings); err != nil {
			return folded{}, err
		}
	}
	slices.Sort(f.changed)
	return f, nil
}

// unchangedFilings reads the filings of the actions the fold left as they were, and
// returns the places of those whose state is the batch's winning event.
func unchangedFilings(ctx context.Context, tx pgx.Tx, w *columns, filings []pgtype.Timestamptz) (confirmed []int64, err error) {
	var projects, domains, runs, actions, clusters []string
	var (
		ords             []int64
		attempts, versns []int32
		phases           []int16
	)
	for i, f := range filings {
		if !f.Valid {
			projects, domains, runs, actions = append(projects, w.projects[i]), append(domains, w.domains[i]), append(runs, w.runs[i]), append(actions, w.actions[i])
			clusters = append(clusters, w.clusters[i])
			ords = append(ords, int64(i+1))
			attempts, phases, versns = append(attempts, w.attempts[i]), append(phases, w.phases[i]), append(versns, w.versions[i])
		}
	}
	rows, err := tx.Query(ctx, filingsSQL, projects, domains, runs, actions, ords, attempts, phases, versns, clusters)
	if err != nil {
		return nil, err
	}
	var (
		ord     int64
		filedAt pgtype.Timestamptz
		current bool
		found   int
	)
	if _, err := pgx.ForEachRow(rows, []any{&ord, &filedAt, &current}, func() error {
		filings[ord-1] = filedAt
		if current {
			confirmed = append(confirmed, ord)
		}
		found++
		return nil
	}); err != nil {
		return nil, err
	}
	if found != len(ords) {
		return nil, fmt.Errorf("%d of the batch's actions have no state after the fold", len(ords)-found)
	}
	slices.Sort(confirmed)
	return confirmed, nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation
}

// prepare checks and encodes the events and sorts them by key, and within one action by
// fold order, so that every statement takes its locks in the same order.
func prepare(events []*eventsv1.ActionEvent) ([]row, error) {
	rows := make([]row, len(events))
	for i, ev := range events {
		if err := checkEvent(i, ev); err != nil {
			return nil, err
		}
		encoded, err := proto.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("store: encoding event %d: %w", i, err)
		}
		if len(encoded) > MaxEventBytes {
			return nil, invalid(fmt.Sprintf("events[%d]", i), "encodes to %d bytes; at most %d", len(encoded), MaxEventBytes)
		}
		occurred := ev.GetOccurredAt().AsTime().Truncate(time.Microsecond)
		rows[i] = row{
			key:     KeyOf(ev.GetId()),
			cluster: ev.GetCluster(),
			fold: foldKey{
				attempt: int32(ev.GetAttempt()), rank: Rank(ev.GetPhase()), version: int32(ev.GetVersion()),
				occurred: occurred, phase: int16(ev.GetPhase()),
			},
			encoded:  encoded,
			occurred: occurred,
		}
	}
	// Sorting positions and placing the rows once is cheaper than sorting the rows,
	// which are large enough for their swaps to dominate.
	order := make([]int32, len(rows))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		return cmp.Or(rows[a].key.compare(rows[b].key), strings.Compare(rows[a].cluster, rows[b].cluster),
			rows[a].fold.compare(rows[b].fold))
	})
	sorted := make([]row, len(rows))
	for i, j := range order {
		sorted[i] = rows[j]
	}
	return sorted, nil
}

// identity is what makes two events the same event.
type identity struct {
	key              Key
	cluster          string
	attempt, version int32
	phase            int16
}

// dedupe returns the rows without repeats of an identity, keeping the first.
func dedupe(rows []row) []row {
	seen := make(map[identity]struct{}, len(rows))
	out := make([]row, 0, len(rows))
	for _, r := range rows {
		id := identity{r.key, r.cluster, r.fold.attempt, r.fold.version, r.fold.phase}
		if _, dup := seen[id]; dup {
			continue
		}
		seen[id] = struct{}{}
		out = append(out, r)
	}
	return out
}

// fold picks each action's greatest event (rows are sorted, so it is the last of its
// action) and its earliest occurrence.
func fold(rows []row) (*columns, []time.Time) {
	win := newColumns(0)
	var created []time.Time
	for i, r := range rows {
		if i == 0 || !rows[i-1].sameAction(r) {
			created = append(created, r.occurred)
		} else {
			created[len(created)-1] = minTime(created[len(created)-1], r.occurred)
		}
		if i == len(rows)-1 || !rows[i+1].sameAction(r) {
			win.add(r)
		}
	}
	return win, created
}

// copySource feeds rows to COPY, each with its action's filing.
func copySource(rows []row, filings []pgtype.Timestamptz) pgx.CopyFromSource {
	i, action := -1, -1
	return pgx.CopyFromFunc(func() ([]any, error) {
		i++
		if i == len(rows) {
			return nil, nil
		}
		r := rows[i]
		if i == 0 || !rows[i-1].sameAction(r) {
			action++
		}
		return []any{r.key.Project, r.key.Domain, r.key.Run, r.key.Action,
			r.fold.attempt, r.fold.phase, r.fold.version, r.occurred, r.encoded, filings[action], r.cluster}, nil
	})
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// columns holds rows as the parallel arrays the statement takes.
type columns struct {
	projects, domains, runs, actions []string
	clusters                         []string
	attempts, versions               []int32
	phases, ranks                    []int16
	occurred                         []time.Time
	encoded                          [][]byte
}

func newColumns(capacity int) *columns {
	return &columns{
		projects: make([]string, 0, capacity), domains: make([]string, 0, capacity),
		runs: make([]string, 0, capacity), actions: make([]string, 0, capacity),
		clusters: make([]string, 0, capacity),
		attempts: make([]int32, 0, capacity), versions: make([]int32, 0, capacity),
		phases: make([]int16, 0, capacity), ranks: make([]int16, 0, capacity),
		occurred: make([]time.Time, 0, capacity), encoded: make([][]byte, 0, capacity),
	}
}

// keysAt returns the keys of the rows at places ords (from 1).
func (c *columns) keysAt(ords []int64) []Key {
	keys := make([]Key, len(ords))
	for i, ord := range ords {
		j := ord - 1
		keys[i] = Key{c.projects[j], c.domains[j], c.runs[j], c.actions[j]}
	}
	return keys
}

func (c *columns) add(r row) {
	c.projects = append(c.projects, r.key.Project)
	c.domains = append(c.domains, r.key.Domain)
	c.runs = append(c.runs, r.key.Run)
	c.actions = append(c.actions, r.key.Action)
	c.clusters = append(c.clusters, r.cluster)
	c.attempts = append(c.attempts, r.fold.attempt)
	c.versions = append(c.versions, r.fold.version)
	c.phases = append(c.phases, r.fold.phase)
	c.ranks = append(c.ranks, r.fold.rank)
	c.occurred = append(c.occurred, r.occurred)
	c.encoded = append(c.encoded, r.encoded)
}

// stateOf is the action's state when this event won the fold.
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

// decodeEvent reads a stored event, with the fields this release does not name: a
// newer client sent them, and its readers get them back as sent.
func decodeEvent(encoded []byte, ev *eventsv1.ActionEvent) error {
	return proto.Unmarshal(encoded, ev)
}

// decodeAction turns an action's winning event into its state.
func decodeAction(event []byte, createdAt time.Time) (*eventsv1.Action, error) {
	var ev eventsv1.ActionEvent
	if err := decodeEvent(event, &ev); err != nil {
		return nil, fmt.Errorf("store: decoding action state: %w", err)
	}
	a := stateOf(&ev)
	a.CreatedAt = timestamppb.New(createdAt)
	return a, nil
}

// GetAction returns the latest state of one action, or ErrNotFound.
//
// cluster names the cluster whose action it is; nil takes the name's action of any
// cluster, and returns an *AmbiguousError when several clusters have one.
func (s *Store) GetAction(ctx context.Context, key Key, cluster *string) (*eventsv1.Action, error) {
	rows, err := s.pool.Query(ctx, getActionSQL, pgx.StrictNamedArgs{
		"project": key.Project, "domain": key.Domain, "run": key.Run, "action": key.Action, "cluster": cluster,
	})
	if err != nil {
		return nil, fmt.Errorf("store: reading action %s: %w", key, err)
	}
	type found struct {
		state     []byte
		createdAt time.Time
		cluster   pgtype.Text
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (found, error) {
		var f found
		err := r.Scan(&f.state, &f.createdAt, &f.cluster)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: reading action %s: %w", key, err)
	}
	switch len(all) {
	case 0:
		return nil, ErrNotFound
	case 1:
		return decodeAction(all[0].state, all[0].createdAt)
	default:
		return nil, &AmbiguousError{Key: key, Clusters: []string{all[0].cluster.String, all[1].cluster.String}}
	}
}

// AmbiguousError says that actions of several clusters have the name a read gave without
// a cluster.
type AmbiguousError struct {
	Key Key
	// Clusters are two of them.
	Clusters []string
}

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("actions of several clusters are named %s (%q and %q, perhaps more): name the cluster", e.Key, e.Clusters[0], e.Clusters[1])
}

// clusterOf resolves a read's cluster: the one given, or else the one cluster whose
// action has the name (NULL for an action the previous release recorded, and when none
// has it: the read then finds nothing). Several are an *AmbiguousError.
func clusterOf(ctx context.Context, q querier, key Key, cluster *string) (pgtype.Text, error) {
	if cluster != nil {
		return pgtype.Text{String: *cluster, Valid: true}, nil
	}
	rows, err := q.Query(ctx, clustersOfSQL, pgx.StrictNamedArgs{
		"project": key.Project, "domain": key.Domain, "run": key.Run, "action": key.Action,
	})
	if err != nil {
		return pgtype.Text{}, err
	}
	clusters, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.Text])
	if err != nil {
		return pgtype.Text{}, err
	}
	switch len(clusters) {
	case 0:
		return pgtype.Text{}, nil
	case 1:
		return clusters[0], nil
	default:
		return pgtype.Text{}, &AmbiguousError{Key: key, Clusters: []string{clusters[0].String, clusters[1].String}}
	}
}

// ActionFilter selects actions to list.
type ActionFilter struct {
	Project, Domain string
	// Run narrows to one run when not empty.
	Run string
	// Phase narrows to one phase when not unspecified.
	Phase flytecorev1.ActionPhase
	// Cluster narrows to one cluster's actions when not nil.
	Cluster *string
}

// ListedAction is an action with its listing position.
type ListedAction struct {
	// Cursor is the action's position; pass it as after to continue after it.
	Cursor int64
	Action *eventsv1.Action
}

// Page bounds one listing: at most Limit items, and no more than MaxBytes of them as
// stored (each counted with ItemOverhead), except that a page always holds one item.
type Page struct {
	Limit    int
	MaxBytes int
}

// ItemOverhead is what a page counts for each item beyond its stored bytes: the tag and
// length that frame it in a response.
const ItemOverhead = 6

// fits says whether an item of size bytes joins a page that holds n items of total bytes.
func (p Page) fits(n, total, size int) bool {
	return n < p.Limit && (n == 0 || total+size <= p.MaxBytes)
}

// ListActions returns a page of actions matching f, newest first, after the cursor (0
// starts at the newest), and whether more follow.
func (s *Store) ListActions(ctx context.Context, f ActionFilter, after int64, page Page) ([]ListedAction, bool, error) {
	args := pgx.StrictNamedArgs{
		"project": f.Project, "domain": f.Domain, "run": nil, "phase": nil, "cluster": f.Cluster, "before": int64(math.MaxInt64),
		"limit": page.Limit + 1, "max_bytes": page.MaxBytes, "item_overhead": ItemOverhead,
	}
	if f.Run != "" {
		args["run"] = f.Run
	}
	if f.Phase != flytecorev1.ActionPhase_ACTION_PHASE_UNSPECIFIED {
		args["phase"] = int16(f.Phase)
	}
	if after > 0 {
		args["before"] = after
	}
	// Planned for each call, for its filters (list_actions.sql says why), in the same
	// round trip.
	rows, err := s.pool.Query(ctx, listActionsSQL, pgx.QueryExecModeCacheDescribe, args)
	if err != nil {
		return nil, false, fmt.Errorf("store: listing actions: %w", err)
	}
	var (
		out       []ListedAction
		more      bool
		total     int
		id        int64
		state     []byte
		createdAt time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &createdAt}, func() error {
		size := len(state) + ItemOverhead
		if more = more || !page.fits(len(out), total, size); more {
			return nil
		}
		a, err := decodeAction(state, createdAt)
		if err != nil {
			return err
		}
		total += size
		out = append(out, ListedAction{Cursor: id, Action: a})
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("store: listing actions: %w", err)
	}
	return out, more, nil
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

// ListActionEvents returns a page of one action's events in order of attempt,
// occurrence, phase and version, after the cursor (the zero cursor starts at the first),
// and whether more follow.
//
// cluster names the cluster whose action it is; nil takes the name's action of any
// cluster, and returns an *AmbiguousError when several clusters have one. The cluster is
// then looked up first, and both statements read one snapshot: between two, retention
// could delete the action looked up and another cluster record one of its name.
func (s *Store) ListActionEvents(ctx context.Context, key Key, cluster *string, after EventCursor, page Page) ([]ListedEvent, bool, error) {
	var (
		out  []ListedEvent
		more bool
	)
	list := func(q querier) (err error) {
		out, more, err = listActionEvents(ctx, q, key, cluster, after, page)
		return err
	}
	var err error
	if cluster != nil {
		err = list(s.pool)
	} else {
		err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
			func(tx pgx.Tx) error { return list(tx) })
	}
	if err != nil {
		return nil, false, fmt.Errorf("store: listing events of %s: %w", key, err)
	}
	return out, more, nil
}

func listActionEvents(ctx context.Context, q querier, key Key, cluster *string, after EventCursor, page Page) ([]ListedEvent, bool, error) {
	resolved, err := clusterOf(ctx, q, key, cluster)
	if err != nil {
		return nil, false, err
	}
	rows, err := q.Query(ctx, listActionEventsSQL, pgx.StrictNamedArgs{
		"project": key.Project, "domain": key.Domain, "run": key.Run, "action": key.Action, "cluster": resolved,
		"attempt": int32(after.Attempt), "occurred_at": after.OccurredAt, "phase": after.Phase, "version": int32(after.Version),
		"limit": page.Limit + 1, "max_bytes": page.MaxBytes, "item_overhead": ItemOverhead,
	})
	if err != nil {
		return nil, false, err
	}
	var (
		out     []ListedEvent
		more    bool
		total   int
		c       EventCursor
		attempt int32
		version int32
		encoded []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&attempt, &c.OccurredAt, &c.Phase, &version, &encoded}, func() error {
		size := len(encoded) + ItemOverhead
		if more = more || !page.fits(len(out), total, size); more {
			return nil
		}
		var ev eventsv1.ActionEvent
		if err := decodeEvent(encoded, &ev); err != nil {
			return fmt.Errorf("decoding event: %w", err)
		}
		total += size
		c.Attempt, c.Version = uint32(attempt), uint32(version)
		out = append(out, ListedEvent{Cursor: c, Event: &ev})
		return nil
	})
	return out, more, err
}

// ActionsByKey returns the current state of the named actions that exist.
func (s *Store) ActionsByKey(ctx context.Context, keys []Key) ([]*eventsv1.Action, error) {
	n := len(keys)
	projects, domains, runs, actions := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, k := range keys {
		projects[i], domains[i], runs[i], actions[i] = k.Project, k.Domain, k.Run, k.Action
	}
	rows, err := s.pool.Query(ctx, actionsByKeySQL,
		pgx.StrictNamedArgs{"projects": projects, "domains": domains, "runs": runs, "actions": actions})
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
