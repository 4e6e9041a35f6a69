// Package cachemigration measures the cache store's migrations from v0.1.0's schema on a
// populated table while v0.1.0's cache service (built from its commit) serves Gets and
// Puts: the longest lock the migrations hold that blocks the service's reads or writes,
// sampled from pg_locks, and what the old service's calls saw meanwhile.
package cachemigration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os/exec"
	"slices"
	"sync"
	"testing/fstest"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/cacheservice/store"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/postgres"
	"github.com/flytekube/backend/test/release"
	"github.com/flytekube/backend/test/repo"
)

// Options size the run.
type Options struct {
	DatabaseURL string
	// Entries is how many entries the table holds when the migrations start.
	Entries int
	// Clients call the old service (half Get, half Put) throughout.
	Clients int
	// Previous runs the migration as it was before it was split (00003 of commit
	// eed9d55, one transaction with the index built in it), for comparison.
	Previous bool
	// LockTimeout is the runner's (postgres.DefaultLockTimeout when 0).
	LockTimeout time.Duration
}

// previousCommit holds the cache store's migration as it was before it was split.
const previousCommit = "eed9d55"

// migrations is the set to apply: the store's, or v0.1.0's two and the previous 00003.
func migrations(ctx context.Context, o Options) (postgres.Migrations, error) {
	m := store.Migrations()
	if !o.Previous {
		return m, nil
	}
	root, err := repo.Root()
	if err != nil {
		return m, err
	}
	prev := fstest.MapFS{}
	for _, name := range []string{"00001_cache.sql", "00002_reservation_holder.sql"} {
		data, err := fs.ReadFile(m.FS, name)
		if err != nil {
			return m, err
		}
		prev[name] = &fstest.MapFile{Data: data}
	}
	data, err := exec.CommandContext(ctx, "git", "-C", root, "show", previousCommit+":cacheservice/store/migrations/00003_use_and_holders.sql").Output()
	if err != nil {
		return m, fmt.Errorf("reading the previous migration from %s: %w", previousCommit, err)
	}
	prev["00003_use_and_holders.sql"] = &fstest.MapFile{Data: data}
	return postgres.Migrations{Service: m.Service, FS: prev}, nil
}

// startRelease runs v0.1.0's cache service on url until ctx ends; it applies v0.1.0's
// migrations first.
func startRelease(ctx context.Context, url string, progress io.Writer) (cachev1connect.CacheServiceClient, func(), error) {
	root, err := repo.Root()
	if err != nil {
		return nil, nil, err
	}
	r, err := release.Find(root, "v0.1.0")
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(progress, "building v0.1.0 from %s (once; minutes the first time)\n", r.Commit[:12])
	build, err := release.Get(ctx, root, r)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(build.Binary("cacheservice"), "--listen=127.0.0.1:0", "--metrics-listen=", "--auth-mode=none", "--database-url="+url)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "serving" {
				addr <- line.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		h, err := rpcclient.New(rpcclient.Options{})
		if err != nil {
			stop()
			return nil, nil, err
		}
		return cachev1connect.NewCacheServiceClient(h, "http://"+a, connect.WithGRPC()), stop, nil
	case <-time.After(time.Minute):
		stop()
		return nil, nil, fmt.Errorf("v0.1.0's cache service did not start within a minute")
	}
}

// call is one call of the old service.
type call struct {
	at, took time.Duration // since the start of the load
	put      bool
	err      error
}

// lockSpan is a stretch of time a migration connection held a blocking lock on a table.
type lockSpan struct {
	table, mode string
	from, to    time.Duration // since the start of the load, as sampled
}

// Run loads the table, starts the old service and its load, applies the migrations,
// and writes the figures as Markdown to w.
func Run(ctx context.Context, o Options, w, progress io.Writer) error {
	m, err := migrations(ctx, o)
	if err != nil {
		return err
	}
	old, stopOld, err := startRelease(ctx, o.DatabaseURL, progress)
	if err != nil {
		return err
	}
	defer stopOld()
	pool, err := postgres.Open(ctx, o.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Fprintf(progress, "loading %d entries\n", o.Entries)
	for done := 0; done < o.Entries; done += 100_000 {
		_, err := pool.Exec(ctx, `INSERT INTO cached_outputs SELECT 'bench', 'development', 'bench.task', '1', 'sig', 'h' || i,
			's3://bench/run-' || i || '/outputs', 'bench', 'development', 'run-' || i, 'a0', 1, now(), now()
			FROM generate_series($1::int, $2::int) i`, done, min(done+100_000, o.Entries)-1)
		if err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE cached_outputs"); err != nil {
		return err
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	start := time.Now()
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	for c := range o.Clients {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				put := c%2 == 1
				at := time.Since(start)
				var err error
				if put {
					k := &cachev1.CacheKey{Project: "bench", Domain: "development", TaskName: "bench.task", CacheVersion: "1",
						Signature: "sig", InputsHash: fmt.Sprintf("put-%d-%d", c, i)}
					_, err = old.Put(loadCtx, connect.NewRequest(&cachev1.PutRequest{Key: k, OutputUri: "s3://bench/put",
						SourceAction: &flytecorev1.ActionIdentifier{Project: "bench", Domain: "development", Run: "r", Action: "a0"}, SourceAttempt: 1}))
				} else {
					k := &cachev1.CacheKey{Project: "bench", Domain: "development", TaskName: "bench.task", CacheVersion: "1",
						Signature: "sig", InputsHash: fmt.Sprintf("h%d", (i*7919+c)%o.Entries)}
					_, err = old.Get(loadCtx, connect.NewRequest(&cachev1.GetRequest{Key: k}))
				}
				if loadCtx.Err() != nil {
					return
				}
				mu.Lock()
				calls = append(calls, call{at: at, took: time.Since(start) - at, put: put, err: err})
				mu.Unlock()
			}
		})
	}

	// The sampler: a connection of its own polls the migration connections' granted
	// locks on the store's tables in a mode that blocks reads or writes.
	stopSampling, err := sample(loadCtx, o.DatabaseURL, start)
	if err != nil {
		stopLoad()
		return err
	}
	time.Sleep(2 * time.Second) // the load's baseline, before the migrations
	fmt.Fprintf(progress, "migrating (%s) while v0.1.0 serves %d clients\n", map[bool]string{true: "the previous 00003", false: "this tree's"}[o.Previous], o.Clients)
	migStart := time.Since(start)
	_, err = postgres.Runner{LockTimeout: o.LockTimeout, Log: slog.New(slog.NewTextHandler(progress, nil))}.Apply(ctx, pool, m)
	migEnd := time.Since(start)
	time.Sleep(2 * time.Second) // and after
	stopLoad()
	wg.Wait()
	held := stopSampling()
	if err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	report(w, o, calls, held, migStart, migEnd)
	return nil
}

// sample polls until ctx ends; its result is the spans seen.
func sample(ctx context.Context, url string, start time.Time) (func() []lockSpan, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	done := make(chan []lockSpan, 1)
	go func() {
		defer func() { _ = conn.Close(context.Background()) }()
		var spans []lockSpan
		open := map[string]*lockSpan{} // by table and mode
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				for _, s := range open {
					spans = append(spans, *s)
				}
				done <- spans
				return
			case <-tick.C:
			}
			now := time.Since(start)
			rows, err := conn.Query(ctx, `SELECT c.relname, l.mode FROM pg_locks l
				JOIN pg_stat_activity a ON a.pid = l.pid AND a.application_name = $1
				JOIN pg_class c ON c.oid = l.relation AND c.relname IN ('cached_outputs', 'reservations')
				WHERE l.granted AND l.locktype = 'relation'
				  AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')`,
				postgres.MigrationApplicationName(store.Migrations().Service))
			if err != nil {
				continue
			}
			seen := map[string]bool{}
			for rows.Next() {
				var table, mode string
				if rows.Scan(&table, &mode) == nil {
					id := table + " " + mode
					seen[id] = true
					if s, ok := open[id]; ok {
						s.to = now
					} else {
						open[id] = &lockSpan{table: table, mode: mode, from: now, to: now}
					}
				}
			}
			rows.Close()
			for id, s := range open {
				if !seen[id] {
					spans = append(spans, *s)
					delete(open, id)
				}
			}
		}
	}()
	return func() []lockSpan { return <-done }, nil
}

func report(w io.Writer, o Options, calls []call, held []lockSpan, migStart, migEnd time.Duration) {
	set := "this tree's migrations (00003–00006)"
	if o.Previous {
		set = "the previous 00003 (one transaction, index built in it)"
	}
	fmt.Fprintf(w, "### Cache store migration at %d entries: %s\n\n", o.Entries, set)
	fmt.Fprintf(w, "Migrations took %s, v0.1.0 serving %d clients (half Get, half Put) throughout.\n\n",
		(migEnd - migStart).Round(time.Millisecond), o.Clients)
	slices.SortFunc(held, func(a, b lockSpan) int { return int((b.to - b.from) - (a.to - a.from)) })
	if len(held) == 0 {
		fmt.Fprintf(w, "- longest lock blocking reads or writes: none seen (sampled every 5 ms)\n")
	}
	for i, s := range held {
		if i == 3 {
			break
		}
		took := "in one sample only (under 10 ms)"
		if s.to > s.from {
			took = fmt.Sprintf("for %s between its first and last sample", (s.to - s.from).Round(time.Millisecond))
		}
		fmt.Fprintf(w, "- lock blocking traffic: %s %s held %s (sampled every 5 ms)\n", s.table, s.mode, took)
	}
	for _, phase := range []struct {
		name     string
		from, to time.Duration
	}{{"before", 0, migStart}, {"during", migStart, migEnd}, {"after", migEnd, 1 << 62}} {
		var lat []time.Duration
		errs := 0
		for _, c := range calls {
			if c.at >= phase.from && c.at < phase.to {
				lat = append(lat, c.took)
				if c.err != nil {
					errs++
				}
			}
		}
		if len(lat) == 0 {
			continue
		}
		slices.Sort(lat)
		fmt.Fprintf(w, "- v0.1.0's calls %s the migrations: %d, %d failed, p50 %s, p99 %s, longest %s\n", phase.name, len(lat), errs,
			benchutil.Percentile(lat, 0.5).Round(10*time.Microsecond), benchutil.Percentile(lat, 0.99).Round(10*time.Microsecond),
			lat[len(lat)-1].Round(time.Millisecond))
	}
	fmt.Fprintln(w)
}
