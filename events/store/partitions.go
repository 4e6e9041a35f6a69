package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flytekube/backend/services/postgres"
)

// action_events is partitioned by range of filed_at (migrations 00005 to 00010):
// every action is filed at the time it was first recorded, and its events carry that
// time, so they all live in the partition whose range holds it. Retention then drops a
// partition once every action filed in it finished before the cutoff, which costs the
// same whatever the partition holds; an action finished since the cutoff is first
// re-filed at the present, its events moved with it, so that one straggler does not
// keep a whole partition. An unfinished action is re-filed further ahead, where it can
// stay until it would be abandoned (Options.UnfinishedTTL after its newest state), so
// that it is moved once rather than at every pass; one already abandoned is dropped
// with the partition.
//
// The partitions' DDL runs under one session-level advisory lock
// (postgres.LockEventsPartitions), so replicas take turns; a replica that finds it held
// skips its turn.

// partitionPrefix starts the name of every partition the service makes.
const partitionPrefix = "action_events_p"

// DefaultPartitionWidth is the span of filing times one partition holds.
const DefaultPartitionWidth = 24 * time.Hour

// DefaultPartitionsAhead is how many partitions beyond the present's are kept ready.
const DefaultPartitionsAhead = 2

// DefaultUnfinishedTTLFactor makes Options.UnfinishedTTL's default from the retention TTL.
const DefaultUnfinishedTTLFactor = 4

// MaxHoldPartitions bounds the partitions retention makes ahead of the present to hold
// unfinished actions: with narrow partitions and a long UnfinishedTTL, such an action is
// then moved once per TTL plus this many partitions' width, rather than once.
const MaxHoldPartitions = 64

// Partition is one partition of action_events: it holds the events of actions filed in
// [From, To). From is the zero time for the first, which holds all earlier times.
type Partition struct {
	Name     string
	From, To time.Time
	// DetachPending says a detach was interrupted; retention finishes it.
	DetachPending bool
}

var (
	//go:embed queries/partitions.sql
	partitionsSQL string
	//go:embed queries/refile_actions.sql
	refileActionsSQL string
	//go:embed queries/refile_events.sql
	refileEventsSQL string
	//go:embed queries/delete_filed.sql
	deleteFiledSQL string
	//go:embed queries/delete_abandoned.sql
	deleteAbandonedSQL string
	//go:embed queries/orphan_partitions.sql
	orphanPartitionsSQL string
)

// Partitions lists action_events' partitions, oldest first.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	return listPartitions(ctx, s.pool)
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func listPartitions(ctx context.Context, q querier) ([]Partition, error) {
	rows, err := q.Query(ctx, partitionsSQL)
	if err != nil {
		return nil, fmt.Errorf("store: listing partitions: %w", err)
	}
	var (
		out  []Partition
		p    Partition
		from *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&p.Name, &p.DetachPending, &from, &p.To}, func() error {
		p.From = time.Time{}
		if from != nil {
			p.From = *from
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: listing partitions: %w", err)
	}
	return out, nil
}

// MaintainPartitions makes the partitions for now and the next ones (Options.PartitionsAhead)
// when they are missing, and returns the names it made. It does nothing when another
// replica is at it.
func (s *Store) MaintainPartitions(ctx context.Context, now time.Time) ([]string, error) {
	return s.maintainPartitions(ctx, now, false)
}

// maintainPartitions is MaintainPartitions; wait waits for another replica's turn to
// end and then looks again, rather than skip.
func (s *Store) maintainPartitions(ctx context.Context, now time.Time, wait bool) ([]string, error) {
	var made []string
	_, err := postgres.WithSessionLock(ctx, s.pool, postgres.LockEventsPartitions, wait, func(conn *pgx.Conn) error {
		// A table made but never attached (a crash between the two) would be in the way.
		if err := dropOrphans(ctx, conn); err != nil {
			return err
		}
		var err error
		made, err = s.makePartitions(ctx, conn, now, now.Add(time.Duration(s.opts.PartitionsAhead+1)*s.opts.PartitionWidth))
		return err
	})
	return made, err
}

// makePartitions makes, on a connection holding the partitions' lock, the partitions
// from now's up to the one holding until, when they are missing, and returns the names
// it made.
func (s *Store) makePartitions(ctx context.Context, conn *pgx.Conn, now, until time.Time) ([]string, error) {
	var made []string
	parts, err := listPartitions(ctx, conn)
	if err != nil {
		return nil, err
	}
	s.observePartitions(parts)
	err = func() error {
		width := s.opts.PartitionWidth
		from := now.Truncate(width)
		if n := len(parts); n > 0 && parts[n-1].To.After(from) {
			from = parts[n-1].To
		}
		for from.Before(until) {
			to := from.Truncate(width).Add(width)
			name := fmt.Sprintf("%s%s_%06dz", partitionPrefix, from.UTC().Format("20060102t150405"), from.Nanosecond()/1000)
			// Made apart and then attached: CREATE TABLE ... PARTITION OF would lock the
			// whole table, and wait for every query on it; ATTACH only keeps other DDL out.
			ident := pgx.Identifier{name}.Sanitize()
			if _, err := conn.Exec(ctx, "CREATE TABLE "+ident+" (LIKE action_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)"); err != nil {
				return fmt.Errorf("store: making partition %s: %w", name, err)
			}
			attach := fmt.Sprintf("ALTER TABLE action_events ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')",
				ident, from.UTC().Format(time.RFC3339Nano), to.UTC().Format(time.RFC3339Nano))
			if _, err := conn.Exec(ctx, attach); err != nil {
				return fmt.Errorf("store: attaching partition %s: %w", name, err)
			}
			made = append(made, name)
			parts = append(parts, Partition{Name: name, From: from, To: to})
			from = to
		}
		return nil
	}()
	s.observePartitions(parts)
	return made, err
}

// observePartitions keeps the end of the newest partition, which bounds the filing
// times Record may give.
func (s *Store) observePartitions(parts []Partition) {
	if n := len(parts); n > 0 {
		s.newestTo.Store(parts[n-1].To.UnixMicro())
	}
}

// filingTime is when Record files a new action: now, unless maintenance has fallen so
// far behind that no partition holds now, in which case the newest partition's last
// microsecond, so that events are still taken.
func (s *Store) filingTime() time.Time { return s.clampToNewest(s.opts.Clock.Now()) }

// isNoPartition says whether err is an insert that found no partition for its row.
func isNoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.CheckViolation && pgErr.ConstraintName == ""
}

// RetentionResult says what one retention pass did.
type RetentionResult struct {
	// Partitions counts the partitions dropped.
	Partitions int
	// Actions counts the actions deleted with them.
	Actions int
	// Refiled counts actions re-filed because they had not finished before the cutoff.
	Refiled int
	// Abandoned counts unfinished actions deleted, their newest state older than
	// Options.UnfinishedTTL; AbandonedSample names the first few.
	Abandoned       int
	AbandonedSample []Key
	// Dropped says what each dropped partition cost.
	Dropped []DroppedPartition
}

// DroppedPartition is one partition retention dropped.
type DroppedPartition struct {
	Name string
	// Actions, Refiled and Abandoned count its finished actions deleted, its actions
	// re-filed and its abandoned ones deleted.
	Actions, Refiled, Abandoned int
	// States is how long re-filing and deleting its actions' states took, in batches;
	// Detach how long detaching it took, Drop how long dropping it (its events) then did.
	States, Detach, Drop time.Duration
}

// DropExpired drops every partition whose actions were all filed before now-ttl, batch
// at a time: first it re-files those of its actions that had not finished by then
// (one finished since at now; an unfinished one ahead, where it can stay until it would
// be abandoned), then deletes the states of the finished ones and of the abandoned
// (unfinished, their newest state older than Options.UnfinishedTTL). Retention thus
// keeps an action's history at least ttl after it finished, and at most ttl plus one
// partition's width. It does nothing when another replica is at it.
func (s *Store) DropExpired(ctx context.Context, now time.Time, ttl time.Duration, batch int) (RetentionResult, error) {
	var res RetentionResult
	cutoff := now.Add(-ttl)
	unfinishedTTL := s.unfinishedTTL(ttl)
	hold := min(unfinishedTTL-ttl, MaxHoldPartitions*s.opts.PartitionWidth)
	_, err := postgres.WithSessionLock(ctx, s.pool, postgres.LockEventsPartitions, false, func(conn *pgx.Conn) error {
		if err := dropOrphans(ctx, conn); err != nil {
			return err
		}
		parts, err := listPartitions(ctx, conn)
		if err != nil {
			return err
		}
		for i, p := range parts {
			// The newest partition stays, whatever its age: filing falls back to it.
			if i == len(parts)-1 || p.To.After(cutoff) {
				break
			}
			if i == 0 {
				// Where unfinished actions are held, made once there is a partition to drop.
				if _, err := s.makePartitions(ctx, conn, now, now.Add(hold+s.opts.PartitionWidth)); err != nil {
					return err
				}
			}
			r := filedRange{
				to: p.To, cutoff: cutoff, now: s.clampToNewest(now), limit: batch,
				abandonCutoff: now.Add(-unfinishedTTL), hold: hold, holdUntil: s.clampToNewest(now.Add(hold)),
			}
			if err := s.dropPartition(ctx, conn, p, r, &res); err != nil {
				return err
			}
		}
		return nil
	})
	return res, err
}

// unfinishedTTL is Options.UnfinishedTTL, or its default, for a retention TTL of ttl.
func (s *Store) unfinishedTTL(ttl time.Duration) time.Duration {
	d := s.opts.UnfinishedTTL
	if d <= 0 {
		d = DefaultUnfinishedTTLFactor * ttl
	}
	return max(d, ttl+s.opts.PartitionWidth)
}

// maxAbandonedSample bounds the abandoned actions a retention pass names.
const maxAbandonedSample = 10

func (s *Store) dropPartition(ctx context.Context, conn *pgx.Conn, p Partition, r filedRange, res *RetentionResult) error {
	d := DroppedPartition{Name: p.Name}
	batch := r.limit
	start := time.Now()
	if !p.DetachPending {
		// The first partition's range starts at MINVALUE: -infinity is its least filing.
		r.from = pgtype.Timestamptz{Time: p.From, Valid: true}
		if p.From.IsZero() {
			r.from = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
		}
		// Re-file the stragglers, then delete the rest, until nothing is filed here; a
		// late event may make a finished action a straggler in between.
		for {
			for {
				refiled, err := refile(ctx, conn, r)
				if err != nil {
					return fmt.Errorf("store: re-filing actions of %s: %w", p.Name, err)
				}
				d.Refiled += refiled
				if refiled < batch {
					break
				}
			}
			resume := r.from
			for {
				var (
					n    int
					last pgtype.Timestamptz
				)
				if err := conn.QueryRow(ctx, deleteFiledSQL, pgx.StrictNamedArgs{
					"from": resume, "to": r.to, "cutoff": r.cutoff, "terminal_rank": terminalRank, "limit": r.limit,
				}).Scan(&n, &last); err != nil {
					return fmt.Errorf("store: deleting actions of %s: %w", p.Name, err)
				}
				d.Actions += n
				if n < batch {
					break
				}
				resume = last
			}
			for {
				keys, err := deleteAbandoned(ctx, conn, r)
				if err != nil {
					return fmt.Errorf("store: deleting abandoned actions of %s: %w", p.Name, err)
				}
				d.Abandoned += len(keys)
				if room := maxAbandonedSample - len(res.AbandonedSample); room > 0 {
					res.AbandonedSample = append(res.AbandonedSample, keys[:min(room, len(keys))]...)
				}
				if len(keys) < batch {
					break
				}
			}
			var left bool
			if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM actions WHERE filed_at >= $1 AND filed_at < $2)", r.from, r.to).Scan(&left); err != nil {
				return fmt.Errorf("store: checking %s is empty: %w", p.Name, err)
			}
			if !left {
				break
			}
		}
	}
	d.States = time.Since(start)
	start = time.Now()
	// Concurrently: Record and the queries go on while the partition leaves the table;
	// a plain DETACH or DROP would lock the whole table until every query on it ended.
	verb := "CONCURRENTLY"
	if p.DetachPending {
		verb = "FINALIZE"
	}
	name := pgx.Identifier{p.Name}.Sanitize()
	if _, err := conn.Exec(ctx, "ALTER TABLE action_events DETACH PARTITION "+name+" "+verb); err != nil {
		return fmt.Errorf("store: detaching %s: %w", p.Name, err)
	}
	d.Detach = time.Since(start)
	start = time.Now()
	if _, err := conn.Exec(ctx, "DROP TABLE "+name); err != nil {
		return fmt.Errorf("store: dropping %s: %w", p.Name, err)
	}
	d.Drop = time.Since(start)
	res.Partitions++
	res.Actions += d.Actions
	res.Refiled += d.Refiled
	res.Abandoned += d.Abandoned
	res.Dropped = append(res.Dropped, d)
	return nil
}

// filedRange is one partition's range and what retention does with it.
type filedRange struct {
	from        pgtype.Timestamptz
	to          time.Time
	cutoff, now time.Time
	limit       int
	// abandonCutoff: an unfinished action whose newest state is older is abandoned.
	abandonCutoff time.Time
	// hold is how far past its newest state an unfinished action is re-filed, up to
	// holdUntil.
	hold      time.Duration
	holdUntil time.Time
}

// deleteAbandoned deletes up to a batch of a partition's abandoned actions' states (their
// events go with the partition) and returns their keys.
func deleteAbandoned(ctx context.Context, conn *pgx.Conn, r filedRange) ([]Key, error) {
	rows, err := conn.Query(ctx, deleteAbandonedSQL, pgx.StrictNamedArgs{
		"from": r.from, "to": r.to, "abandon_cutoff": r.abandonCutoff, "terminal_rank": terminalRank, "limit": r.limit,
	})
	if err != nil {
		return nil, err
	}
	var (
		keys []Key
		k    Key
	)
	_, err = pgx.ForEachRow(rows, []any{&k.Project, &k.Domain, &k.Run, &k.Action}, func() error {
		keys = append(keys, k)
		return nil
	})
	return keys, err
}

// clampToNewest keeps a filing time inside the newest partition known.
func (s *Store) clampToNewest(now time.Time) time.Time {
	now = now.Truncate(time.Microsecond)
	if to := s.newestTo.Load(); to != 0 && now.UnixMicro() >= to {
		return time.UnixMicro(to - 1)
	}
	return now
}

// refile moves up to a batch of a partition's unfinished actions (and those finished
// since the cutoff), and their events, to their new filings (refile_actions.sql), in one
// transaction: actions first, as Record locks them, then in a second statement (whose
// snapshot sees what Records holding those actions committed) their events.
func refile(ctx context.Context, conn *pgx.Conn, r filedRange) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, refileActionsSQL, pgx.StrictNamedArgs{
			"from": r.from, "to": r.to, "cutoff": r.cutoff, "now": r.now, "terminal_rank": terminalRank, "limit": r.limit,
			"abandon_cutoff": r.abandonCutoff, "hold": r.hold, "hold_until": r.holdUntil,
		})
		if err != nil {
			return err
		}
		var (
			projects, domains, runs, actions []string
			clusters                         []pgtype.Text
			filings                          []time.Time
			k                                Key
			cluster                          pgtype.Text
			filed                            time.Time
		)
		if _, err := pgx.ForEachRow(rows, []any{&k.Project, &k.Domain, &k.Run, &k.Action, &cluster, &filed}, func() error {
			projects, domains, runs, actions = append(projects, k.Project), append(domains, k.Domain), append(runs, k.Run), append(actions, k.Action)
			clusters, filings = append(clusters, cluster), append(filings, filed)
			return nil
		}); err != nil {
			return err
		}
		if n = len(projects); n == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, refileEventsSQL, pgx.StrictNamedArgs{
			"from": r.from, "to": r.to,
			"projects": projects, "domains": domains, "runs": runs, "actions": actions, "clusters": clusters, "filings": filings,
		})
		return err
	})
	return n, err
}

// dropOrphans drops partitions a crash left detached but not dropped.
func dropOrphans(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, orphanPartitionsSQL, strings.ReplaceAll(partitionPrefix, "_", `\_`)+"%")
	if err != nil {
		return fmt.Errorf("store: finding detached partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("store: finding detached partitions: %w", err)
	}
	for _, name := range names {
		if _, err := conn.Exec(ctx, "DROP TABLE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("store: dropping detached %s: %w", name, err)
		}
	}
	return nil
}
