package eventsbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/eventsrelease"
)

// MigrationSize sizes the migration part: the tree's events store migration run on a
// store of the previous release's schema while that release's events service serves a
// steady writer and a reader.
type MigrationSize struct {
	// Stored are the store sizes, in events (five an action), loaded server-side.
	Stored []int
	// Rate is the steady writer's events per second, in batches of ten.
	Rate float64
	// Release is the release serving (a version in RELEASES).
	Release string
	// Settle is how long the writer and the reader run before the migration, and again
	// after it.
	Settle time.Duration
	// Dir, when set, holds the migration files to run instead of the tree's (another
	// design, for comparison), named as the tree's are.
	Dir string
}

// MigrationPoint is one store size's figures.
type MigrationPoint struct {
	Stored int
	// Load is how long loading the store (and vacuuming it) took; not part of the
	// migration.
	Load time.Duration
	// Migration is the whole migration, as the runner ran it, tries included; Tries
	// counts its runs (a file that gives up on lock_timeout is run again).
	Migration time.Duration
	Tries     int
	// Steps are the migration files' durations, from the runner's log, in order.
	Steps []MigrationStep
	// Records counts the previous release's deliveries (a batch recorded, tries
	// included), Delivered those that succeeded, Reads its reads; LongestCall is its
	// longest call of any kind (a try that failed included), LongestDelivery the longest
	// delivery (first try to success), LongestRead the longest read.
	Records, Delivered, Reads int
	// LongestBefore, LongestDuring and LongestAfter are the longest calls that started
	// before the migration (the baseline of the same run), during it and after it.
	LongestBefore, LongestDuring, LongestAfter time.Duration
	LongestCall, LongestDelivery, LongestRead  time.Duration
	// RecordsDuring is how many deliveries that succeeded overlapped the migration.
	RecordsDuring int
	// Failures counts the calls that failed (a delivery's failed tries included), and
	// FailureSample shows a few.
	Failures      int
	FailureSample []string
}

// MigrationStep is one migration file.
type MigrationStep struct {
	File     string
	Duration time.Duration
}

// Migration runs the migration part at each size.
func Migration(ctx context.Context, o Options, progress io.Writer) ([]MigrationPoint, error) {
	m := o.MigrationSize
	fmt.Fprintf(progress, "migration: building %s's events service (once, cached)\n", m.Release)
	binary, err := eventsrelease.Binary(ctx, m.Release)
	if err != nil {
		return nil, err
	}
	var out []MigrationPoint
	for _, n := range m.Stored {
		p, err := migrationAt(ctx, o, binary, n, progress)
		if err != nil {
			return out, fmt.Errorf("%d events: %w", n, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func migrationAt(ctx context.Context, o Options, binary string, n int, progress io.Writer) (MigrationPoint, error) {
	m := o.MigrationSize
	p := MigrationPoint{Stored: n}
	url, err := freshDatabase(ctx, o.DatabaseURL, "events_bench_migration")
	if err != nil {
		return p, err
	}
	logPath := filepath.Join(os.TempDir(), "events-bench-migration-"+m.Release+".log")
	fmt.Fprintf(progress, "migration: %d events: starting %s (log: %s)\n", n, m.Release, logPath)
	svc, err := eventsrelease.Start(ctx, binary, url, logPath)
	if err != nil {
		return p, err
	}
	defer svc.Stop()
	pool, err := postgres.Open(ctx, url)
	if err != nil {
		return p, err
	}
	defer pool.Close()

	start := time.Now()
	actions, err := loadPreviousSchema(ctx, pool, n)
	if err != nil {
		return p, fmt.Errorf("loading: %w", err)
	}
	p.Load = time.Since(start)
	fmt.Fprintf(progress, "migration: %d events loaded in %s; %s of steady load before the migration\n", n, p.Load.Round(time.Second), m.Settle)

	load := startOldLoad(ctx, svc.Client, m.Rate, actions)
	time.Sleep(m.Settle)
	migrations := store.Migrations()
	if m.Dir != "" {
		migrations.FS = os.DirFS(m.Dir)
	}
	steps := watchSteps(ctx, pool)
	load.migrating.Store(true)
	load.phase.Store(1)
	start = time.Now()
	for p.Tries = 1; ; p.Tries++ {
		_, err = postgres.Migrate(ctx, pool, migrations, slog.New(slog.DiscardHandler))
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.LockNotAvailable || p.Tries == 20 {
			break
		}
		fmt.Fprintf(progress, "migration: a step gave up on lock_timeout; running the migration again\n")
	}
	p.Migration = time.Since(start)
	load.migrating.Store(false)
	load.phase.Store(2)
	p.Steps = steps.stop(start, migrations.FS)
	if err != nil {
		load.stop()
		return p, fmt.Errorf("migrating: %w", err)
	}
	fmt.Fprintf(progress, "migration: %d events: migrated in %s (%d tries); %s of steady load after it\n", n, p.Migration.Round(time.Millisecond), p.Tries, m.Settle)
	time.Sleep(m.Settle)
	load.stop()
	load.report(&p)
	return p, nil
}

// benchEventTail encodes the event of a loaded action's i-th phase, without its id,
// which the load prepends (an encoded message is the concatenation of its fields).
func benchEventTails() ([][]byte, error) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var tails [][]byte
	for i, p := range phases {
		b, err := proto.Marshal(&eventsv1.ActionEvent{
			Attempt: 1, Phase: p.phase, Version: p.version,
			OccurredAt: timestamppb.New(t0.Add(time.Duration(i) * time.Millisecond)),
			ReportedAt: timestamppb.New(t0.Add(time.Duration(i+1) * time.Millisecond)),
			Cluster:    "bench-cluster", TaskType: "container",
			Reason: "BenchmarkPhase", Message: "a phase change of a benchmark action, of typical length",
		})
		if err != nil {
			return nil, err
		}
		tails = append(tails, b)
	}
	return tails, nil
}

// loadPreviousSchema fills the previous release's tables with n events (five for each
// of n/5 actions, ten actions a run, all finished) server-side, as that release's Record
// would have left them, and vacuums them as a store that has served would be; it
// returns the actions' keys. The outbox's trigger is off meanwhile (no sink would get
// these), and the key is built after the rows, which is faster than row by row.
func loadPreviousSchema(ctx context.Context, pool *pgxpool.Pool, n int) ([]store.Key, error) {
	tails, err := benchEventTails()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	actions := n / len(phases)
	var phaseNums, versions []int32
	for _, p := range phases {
		phaseNums, versions = append(phaseNums, int32(p.phase)), append(versions, int32(p.version))
	}
	for _, stmt := range []string{
		"SET session_replication_role = replica",
		"SET maintenance_work_mem = '512MB'",
		"ALTER TABLE action_events DROP CONSTRAINT action_events_pkey",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	// An event is its id (field 1: project and domain, fixed, then run and action,
	// fields of at most 127 bytes: tag, length, bytes) and the rest of its fields.
	idPrefix := []byte{0x0a, 5, 'b', 'e', 'n', 'c', 'h', 0x12, 11, 'd', 'e', 'v', 'e', 'l', 'o', 'p', 'm', 'e', 'n', 't'}
	const encoded = `'\x0a'::bytea || set_byte('\x00'::bytea, 0, length($7::bytea) + 4 + length(k.run) + length(k.action)) || $7::bytea
    || '\x1a'::bytea || set_byte('\x00'::bytea, 0, length(k.run)) || convert_to(k.run, 'UTF8')
    || '\x22'::bytea || set_byte('\x00'::bytea, 0, length(k.action)) || convert_to(k.action, 'UTF8')`
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	last := len(phases)
	if _, err := conn.Exec(ctx, `
INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event)
SELECT 'bench', 'development', k.run, k.action, 1, ($2::int[])[i], ($3::int[])[i],
       $4::timestamptz + a * interval '10 ms' + i * interval '1 ms',
       `+encoded+` || ($1::bytea[])[i]
FROM generate_series(0, $5::int - 1) AS a,
     LATERAL (SELECT 'load-r' || (a / 10) AS run, 'a' || (a % 10) AS action) AS k,
     generate_series(1, $6::int) AS i`,
		tails, phaseNums, versions, t0, actions, last, idPrefix); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `
INSERT INTO actions (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event)
SELECT 'bench', 'development', k.run, k.action, 1, $2::int, $3::int, 5,
       $4::timestamptz + a * interval '10 ms' + $5::int * interval '1 ms', $4::timestamptz + a * interval '10 ms',
       `+encoded+` || $1::bytea
FROM generate_series(0, $6::int - 1) AS a,
     LATERAL (SELECT 'load-r' || (a / 10) AS run, 'a' || (a % 10) AS action) AS k`,
		tails[last-1], phaseNums[last-1], versions[last-1], t0, last, actions, idPrefix); err != nil {
		return nil, err
	}
	for _, stmt := range []string{
		"ALTER TABLE action_events ADD PRIMARY KEY (project, domain, run, action, attempt, phase, version)",
		"RESET session_replication_role",
		"VACUUM (ANALYZE) action_events",
		"VACUUM (ANALYZE) actions",
		"CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	keys := make([]store.Key, actions)
	for a := range keys {
		keys[a] = store.Key{Project: "bench", Domain: "development", Run: fmt.Sprintf("load-r%d", a/10), Action: fmt.Sprintf("a%d", a%10)}
	}
	return keys, nil
}

// oldLoad is the previous release's traffic: a steady writer, which retries a failed
// delivery as the executor does, and a reader.
type oldLoad struct {
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	migrating atomic.Bool
	// phase is 0 before the migration, 1 during it, 2 after; a call counts in the
	// phase it started in.
	phase atomic.Int32
	// longestBy is the longest call of each phase.
	longestBy [3]time.Duration

	mu                                        sync.Mutex
	records, delivered, reads, during         int
	longestCall, longestDelivery, longestRead time.Duration
	failures                                  int
	sample                                    []string
}

func startOldLoad(ctx context.Context, c eventsv1connect.EventsServiceClient, rate float64, loaded []store.Key) *oldLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &oldLoad{cancel: cancel}
	const batch = 10
	l.wg.Go(func() {
		// Ten events a tick; every fifth batch is delivered again with the next, as the
		// executor does after a call timed out.
		prefix := fmt.Sprintf("live%d", time.Now().UnixNano())
		tick := time.NewTicker(time.Duration(float64(time.Second) * batch / rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// A batch is two actions' five events each.
			b := generateFrom(prefix, 2*i, batch, 10)
			l.wg.Go(func() { l.deliver(ctx, c, b) })
			if i%5 == 4 {
				prev := generateFrom(prefix, 2*(i-1), batch, 10)
				l.wg.Go(func() { l.deliver(ctx, c, prev) })
			}
		}
	})
	l.wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for ctx.Err() == nil {
			k := loaded[rng.IntN(len(loaded))]
			id := &flytecorev1.ActionIdentifier{Project: k.Project, Domain: k.Domain, Run: k.Run, Action: k.Action}
			l.read(ctx, "GetAction", func(ctx context.Context) error {
				_, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: id}))
				return err
			})
			l.read(ctx, "ListActionEvents", func(ctx context.Context) error {
				_, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: 100}))
				return err
			})
			l.read(ctx, "ListActions", func(ctx context.Context) error {
				_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: k.Project, Domain: k.Domain, PageSize: 50}))
				return err
			})
		}
	})
	return l
}

// deliver records b until it is taken, waiting 100 ms after the first failure and twice
// as long after each next one, up to 30 s, as the executor's event sink does.
func (l *oldLoad) deliver(ctx context.Context, c eventsv1connect.EventsServiceClient, b []*eventsv1.ActionEvent) {
	start := time.Now()
	during := l.migrating.Load()
	l.mu.Lock()
	l.records++
	l.mu.Unlock()
	wait := 100 * time.Millisecond
	for {
		callCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
		t, phase := time.Now(), l.phase.Load()
		_, err := c.Record(callCtx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
		d := time.Since(t)
		cancel()
		if ctx.Err() == nil {
			l.mu.Lock()
			l.longestCall = max(l.longestCall, d)
			l.longestBy[phase] = max(l.longestBy[phase], d)
			l.mu.Unlock()
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		l.fail("Record", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
	d := time.Since(start)
	during = during || l.migrating.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delivered++
	if during {
		l.during++
	}
	l.longestDelivery = max(l.longestDelivery, d)
}

func (l *oldLoad) read(ctx context.Context, name string, call func(context.Context) error) {
	start, phase := time.Now(), l.phase.Load()
	callCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err := call(callCtx)
	cancel()
	d := time.Since(start)
	if ctx.Err() != nil {
		return
	}
	if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		l.fail(name, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reads++
	l.longestRead = max(l.longestRead, d)
	l.longestCall = max(l.longestCall, d)
	l.longestBy[phase] = max(l.longestBy[phase], d)
}

func (l *oldLoad) fail(name string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures++
	if len(l.sample) < 5 {
		l.sample = append(l.sample, name+": "+err.Error())
	}
}

// stop ends the load, and waits for the deliveries in flight.
func (l *oldLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *oldLoad) report(p *MigrationPoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p.Records, p.Delivered, p.Reads, p.RecordsDuring = l.records, l.delivered, l.reads, l.during
	p.LongestCall, p.LongestDelivery, p.LongestRead = l.longestCall, l.longestDelivery, l.longestRead
	p.LongestBefore, p.LongestDuring, p.LongestAfter = l.longestBy[0], l.longestBy[1], l.longestBy[2]
	p.Failures, p.FailureSample = l.failures, l.sample
}

// stepWatch sees the migration files end: their versions appear in the runner's
// version table, polled every 10 ms (the runner logs nothing of it). Files that end
// within one poll are seen as one step.
type stepWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	// seen are the versions seen, in order, and when; the first is the one before.
	seen []seenVersion
}

type seenVersion struct {
	version int64
	at      time.Time
}

func watchSteps(ctx context.Context, pool *pgxpool.Pool) *stepWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &stepWatch{cancel: cancel, done: make(chan struct{})}
	look := func(ctx context.Context) {
		var version int64
		if err := pool.QueryRow(ctx, "SELECT coalesce(max(version_id), 0) FROM events_schema_version WHERE is_applied").Scan(&version); err != nil {
			return
		}
		if n := len(w.seen); n == 0 || w.seen[n-1].version != version {
			w.seen = append(w.seen, seenVersion{version, time.Now()})
		}
	}
	look(ctx)
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
			look(ctx)
		}
		look(context.WithoutCancel(ctx)) // the last file, if it ended since
	}()
	return w
}

// stop ends the watch and returns the steps seen, each timed from the end of the one
// before (the first from start).
func (w *stepWatch) stop(start time.Time, fsys fs.FS) []MigrationStep {
	w.cancel()
	<-w.done
	files, _ := fs.Glob(fsys, "*.sql")
	var out []MigrationStep
	prev := start
	for i := 1; i < len(w.seen); i++ {
		var names []string
		for _, f := range files {
			var v int64
			if _, err := fmt.Sscanf(f, "%d_", &v); err == nil && v > w.seen[i-1].version && v <= w.seen[i].version {
				names = append(names, strings.TrimSuffix(f, ".sql"))
			}
		}
		out = append(out, MigrationStep{File: strings.Join(names, ", "), Duration: w.seen[i].at.Sub(prev)})
		prev = w.seen[i].at
	}
	return out
}

// WriteMigration writes the migration part's report.
func WriteMigration(w io.Writer, o Options, points []MigrationPoint) {
	if len(points) == 0 {
		return
	}
	m := o.MigrationSize
	what := "The events store's migration"
	if m.Dir != "" {
		what = "The migration in " + m.Dir
	}
	fmt.Fprintf(w, "\n### %s from %s's schema while %s serves (a writer at %.0f events/s, retrying as the executor does, and a reader)\n\n",
		what, m.Release, m.Release, m.Rate)
	header, rule := "| | ", "| --- |"
	for _, p := range points {
		header += fmt.Sprintf(" %d events |", p.Stored)
		rule += " ---: |"
	}
	fmt.Fprintln(w, header)
	fmt.Fprintln(w, rule)
	row := func(name string, f func(p MigrationPoint) string) {
		line := "| " + name + " |"
		for _, p := range points {
			line += " " + f(p) + " |"
		}
		fmt.Fprintln(w, line)
	}
	row("migration, start to end (runs)", func(p MigrationPoint) string {
		return fmt.Sprintf("%s (%d)", p.Migration.Round(10*time.Millisecond), p.Tries)
	})
	row("its steps (files ending within 10 ms of each other are one)", func(p MigrationPoint) string {
		var steps []string
		for _, s := range p.Steps {
			steps = append(steps, fmt.Sprintf("%s: %s", s.File, s.Duration.Round(time.Millisecond)))
		}
		return strings.Join(steps, "<br>")
	})
	row("longest call of "+m.Release+" (any, a failed try included)", func(p MigrationPoint) string { return p.LongestCall.Round(time.Millisecond).String() })
	row("&nbsp;&nbsp;started before the migration, during it, after it", func(p MigrationPoint) string {
		return fmt.Sprintf("%s, **%s**, %s", p.LongestBefore.Round(time.Millisecond), p.LongestDuring.Round(time.Millisecond), p.LongestAfter.Round(time.Millisecond))
	})
	row("longest read of "+m.Release, func(p MigrationPoint) string { return p.LongestRead.Round(time.Millisecond).String() })
	row("longest delivery of "+m.Release+" (a batch's first try to success)", func(p MigrationPoint) string { return p.LongestDelivery.Round(time.Millisecond).String() })
	row(m.Release+"'s calls that failed", func(p MigrationPoint) string {
		return fmt.Sprintf("%d (of %d reads, and tries of %d deliveries: %d delivered, %d of them overlapping the migration)",
			p.Failures, p.Reads, p.Records, p.Delivered, p.RecordsDuring)
	})
	row("loading the store (not measured)", func(p MigrationPoint) string { return p.Load.Round(time.Second).String() })
	for _, p := range points {
		for _, s := range p.FailureSample {
			fmt.Fprintf(w, "\n%d events: %s", p.Stored, strings.ReplaceAll(s, "|", "\\|"))
		}
	}
	fmt.Fprintln(w)
}
