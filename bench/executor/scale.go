package executorbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/controller"
	"github.com/flytekube/backend/test/kubetest"
)

// sustainedResult is what the API server held while actions arrived at a steady rate,
// with the collector's default settings.
type sustainedResult struct {
	rate       float64 // actions per second offered
	achieved   float64 // created per second
	duration   time.Duration
	namespaces int
	created    int
	gc         config.GCConfig
	// admission: the finalizer was put on at admission (component finalizer-at-admission).
	admission bool
	// samples every 10 s: actions stored, etcd's size in use.
	samples []sustainedSample
	// heaps: the process's live heap (the executor and both services) after a GC when
	// the run had delivered each of these many actions.
	heaps []heapSample
	// afterLast is what was stored three minutes after the last action was delivered.
	afterLast int
	// held and empty: stored actions and the live heap and etcd's compacted size
	// with the store at its bound and once the collector has emptied it.
	heldActions         int
	heldHeap, emptyHeap uint64
	heldEtcd, emptyEtcd int64
	emptiedIn           time.Duration
	maxStored           int
	maxEtcd             int64
	// tables: the events database at the end (no retention: every event of the run).
	tables []tableSize
}

type sustainedSample struct {
	at        time.Duration
	delivered int64
	stored    int
	etcd      int64
}

type heapSample struct {
	delivered int64
	heap      uint64
}

// runSustained offers o.ScaleRate actions a second (core-sleep 0s, spread over four
// namespaces) for o.ScaleDuration to one executor with the default configuration, and
// samples what the API server and etcd hold and the process's heap.
func runSustained(ctx context.Context, env *kubetest.Env, o Options, eventsURL, databaseURL string, progress io.Writer) (sustainedResult, error) {
	if o.HeapProfiles != "" {
		runtime.MemProfileRate = 4096 // finer than the default, so that what each action costs shows
	}
	cfg := config.Default()
	r := sustainedResult{rate: o.ScaleRate, duration: o.ScaleDuration, namespaces: 4, gc: cfg.GC, admission: o.FinalizerAtAdmission}
	suffix := time.Now().UnixNano() % 1e6
	var namespaces []string
	for i := range r.namespaces {
		ns := fmt.Sprintf("sustained-%d-%d", suffix, i)
		if err := namespace(ctx, env.Client, ns); err != nil {
			return r, err
		}
		namespaces = append(namespaces, ns)
		if o.FinalizerAtAdmission {
			remove, err := kubetest.FinalizerAtAdmission(ctx, env.Client, ns, controller.Finalizer)
			defer remove()
			if err != nil {
				return r, err
			}
		}
	}
	cfg.MetricsBindAddress, cfg.HealthProbeBindAddress = "0", "0"
	cfg.EventsServiceURL = eventsURL
	restConfig := rest.CopyConfig(env.Config)
	restConfig.QPS, restConfig.Burst = 1000, 2000
	var delivered atomic.Int64
	var lastDelivered atomic.Int64 // unix nanoseconds
	cfg.Namespaces = namespaces
	_, stop, err := startExecutor(ctx, cfg, restConfig, executor.Options{
		OnDelivered: func(*flytev1.TaskAction) {
			delivered.Add(1)
			lastDelivered.Store(time.Now().UnixNano())
		},
	})
	if err != nil {
		return r, err
	}
	defer stop()
	etcd := etcdStore{url: env.EtcdURL()}
	stored := func() (int, error) {
		n := 0
		for _, ns := range namespaces {
			var list metav1.PartialObjectMetadataList
			list.SetGroupVersionKind(schema.GroupVersionKind{Group: flytev1.GroupVersion.Group, Version: flytev1.GroupVersion.Version, Kind: "TaskActionList"})
			if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
				return 0, err
			}
			n += len(list.Items)
		}
		return n, nil
	}

	// The load: a ticker hands out action numbers at the rate; 16 clients create them.
	start := time.Now()
	numbers := make(chan int, 16) // no more than the clients can create: the run ends on time
	var created atomic.Int64
	var createErr atomic.Value
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range numbers {
				ta := action(namespaces[i%len(namespaces)], fmt.Sprintf("s%07d", i), "core-sleep")
				ta.Spec.Config = map[string]string{"duration": "0s"}
				if err := env.Client.Create(ctx, ta); err != nil {
					createErr.CompareAndSwap(nil, err)
					continue
				}
				created.Add(1)
			}
		})
	}
	go func() {
		defer close(numbers)
		interval := time.Duration(float64(time.Second) / o.ScaleRate)
		next := start
		for i := 0; time.Since(start) < o.ScaleDuration; i++ {
			if wait := time.Until(next); wait > 0 {
				time.Sleep(wait)
			}
			select {
			case numbers <- i:
			case <-ctx.Done():
				return
			}
			next = next.Add(interval)
		}
	}()

	// The heap at 10,000 delivered, and at the end.
	heapAt := []int64{10000}
	sample := time.NewTicker(10 * time.Second)
	defer sample.Stop()
	loadDone := make(chan struct{})
	go func() { wg.Wait(); close(loadDone) }()
	for running := true; running; {
		select {
		case <-loadDone:
			running = false
		case <-sample.C:
		}
		for len(heapAt) > 0 && delivered.Load() >= heapAt[0] {
			r.heaps = append(r.heaps, heapSample{delivered: delivered.Load(), heap: benchutil.LiveHeap()})
			heapAt = heapAt[1:]
		}
		n, err := stored()
		if err != nil {
			return r, err
		}
		size, err := etcd.inUse(ctx)
		if err != nil {
			return r, err
		}
		r.samples = append(r.samples, sustainedSample{at: time.Since(start), delivered: delivered.Load(), stored: n, etcd: size})
		r.maxStored, r.maxEtcd = max(r.maxStored, n), max(r.maxEtcd, size)
		fmt.Fprintf(progress, "sustained: %s, %d created, %d delivered, %d stored, etcd %.1f MB in use\n",
			time.Since(start).Round(time.Second), created.Load(), delivered.Load(), n, float64(size)/1e6)
	}
	if err, ok := createErr.Load().(error); ok {
		return r, fmt.Errorf("creating: %w", err)
	}
	r.created = int(created.Load())
	r.achieved = float64(r.created) / time.Since(start).Seconds()
	for delivered.Load() < created.Load() {
		if time.Since(start) > o.ScaleDuration+5*time.Minute {
			return r, fmt.Errorf("%d of %d delivered", delivered.Load(), created.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	last := time.Unix(0, lastDelivered.Load())
	r.heaps = append(r.heaps, heapSample{delivered: delivered.Load(), heap: benchutil.LiveHeap()})

	// The store at its bound: compacted, so that etcd's size is what it holds.
	if r.heldEtcd, err = etcd.compacted(ctx); err != nil {
		return r, err
	}
	if r.heldActions, err = stored(); err != nil {
		return r, err
	}
	r.heldHeap = benchutil.LiveHeap()
	if o.HeapProfiles != "" {
		if err := writeHeapProfile(filepath.Join(o.HeapProfiles, "heap-held.pprof")); err != nil {
			return r, err
		}
	}

	time.Sleep(time.Until(last.Add(3 * time.Minute)))
	if r.afterLast, err = stored(); err != nil {
		return r, err
	}
	// Then until the collector has emptied it (the default TTL after the last).
	for {
		n, err := stored()
		if err != nil {
			return r, err
		}
		if n == 0 {
			r.emptiedIn = time.Since(last)
			break
		}
		if time.Since(last) > cfg.GC.MaxTTL.Duration+2*time.Minute {
			return r, fmt.Errorf("%d actions still stored %s after the last", n, time.Since(last).Round(time.Second))
		}
		time.Sleep(time.Second)
	}
	if r.emptyEtcd, err = etcd.compacted(ctx); err != nil {
		return r, err
	}
	r.emptyHeap = benchutil.LiveHeap()
	if o.HeapProfiles != "" {
		if err := writeHeapProfile(filepath.Join(o.HeapProfiles, "heap-empty.pprof")); err != nil {
			return r, err
		}
	}
	r.tables, err = tableSizes(ctx, databaseURL)
	return r, err
}

// tableSize is what one of the events service's tables holds.
type tableSize struct {
	name  string
	rows  int64
	bytes int64 // with its indexes and TOAST
}

// tableSizes reads the events service's tables' sizes, vacuumed so that dead rows and
// free space do not count.
func tableSizes(ctx context.Context, databaseURL string) ([]tableSize, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var sizes []tableSize
	for _, table := range []string{"action_events", "actions"} {
		if _, err := conn.Exec(ctx, "VACUUM (FULL, ANALYZE) "+table); err != nil {
			return nil, fmt.Errorf("postgres: vacuum %s: %w", table, err)
		}
		t := tableSize{name: table}
		// Summed over the partitions of a partitioned table, which holds no rows of its own;
		// pg_partition_tree lists nothing for a plain one.
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+table+`),
	coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1::regclass)), pg_total_relation_size($1::regclass))::bigint`, table).Scan(&t.rows, &t.bytes); err != nil {
			return nil, fmt.Errorf("postgres: size of %s: %w", table, err)
		}
		sizes = append(sizes, t)
	}
	return sizes, nil
}

// etcdStore reads etcd's size through its metrics and compacts it through its JSON
// gateway, as the API server does every five minutes.
type etcdStore struct{ url string }

func (e etcdStore) inUse(ctx context.Context) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("etcd metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	const name = "etcd_mvcc_db_total_size_in_use_in_bytes "
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		if line, ok := strings.CutPrefix(scanner.Text(), name); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(line), 64)
			return int64(v), err
		}
	}
	return 0, fmt.Errorf("etcd metrics: no %s", strings.TrimSpace(name))
}

// compacted compacts etcd to its current revision and returns its size in use then.
func (e etcdStore) compacted(ctx context.Context) (int64, error) {
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := e.post(ctx, "/v3/kv/range", map[string]any{"key": base64.StdEncoding.EncodeToString([]byte("/"))}, &rng); err != nil {
		return 0, err
	}
	if err := e.post(ctx, "/v3/kv/compaction", map[string]any{"revision": rng.Header.Revision, "physical": true}, nil); err != nil {
		return 0, err
	}
	// The freed pages show in the size in use once the compaction's batches commit.
	time.Sleep(2 * time.Second)
	return e.inUse(ctx)
}

func (e etcdStore) post(ctx context.Context, path string, body, out any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+path, bytes.NewReader(data))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, answer)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(answer, out)
}

func (r sustainedResult) write(w io.Writer) {
	fmt.Fprintf(w, "### Sustained load: %.0f actions/s offered for %s, over %d namespaces, default collector\n\n", r.rate, r.duration, r.namespaces)
	finalizer := "the executor puts its finalizer on"
	if r.admission {
		finalizer = "the finalizer put on at admission (component finalizer-at-admission)"
	}
	fmt.Fprintf(w, "One executor, default configuration (gc: every %s, a finished action kept %s, at most %d in all and %d per namespace, %.0f deletes/s); %s; every action a core-sleep 0s created by 16 clients; %d created (%.1f/s achieved).\n\n",
		r.gc.Interval.Duration, r.gc.MaxTTL.Duration, r.gc.MaxFinished, r.gc.MaxFinishedPerNamespace, r.gc.DeletesPerSecond, finalizer, r.created, r.achieved)
	fmt.Fprintln(w, "| figure | value |")
	fmt.Fprintln(w, "| --- | ---: |")
	fmt.Fprintf(w, "| most actions stored at once (a sample every 10 s) | %d |\n", r.maxStored)
	fmt.Fprintf(w, "| most etcd size in use (uncompacted) | %.1f MB |\n", float64(r.maxEtcd)/1e6)
	fmt.Fprintf(w, "| actions stored when the last was delivered | %d |\n", r.heldActions)
	fmt.Fprintf(w, "| etcd compacted then, against empty | %.1f MB, %.1f MB |\n", float64(r.heldEtcd)/1e6, float64(r.emptyEtcd)/1e6)
	if r.heldActions > 0 {
		fmt.Fprintf(w, "| etcd bytes per stored finished action (compacted) | %.0f B |\n", float64(r.heldEtcd-r.emptyEtcd)/float64(r.heldActions))
		fmt.Fprintf(w, "| process heap per stored finished action (all cached, against empty) | %.2f KB |\n", (float64(r.heldHeap)-float64(r.emptyHeap))/float64(r.heldActions)/1e3)
	}
	fmt.Fprintf(w, "| actions stored 3 minutes after the last was delivered | %d |\n", r.afterLast)
	fmt.Fprintf(w, "| store empty after the last was delivered | %s |\n", r.emptiedIn.Round(time.Second))
	for i, h := range r.heaps {
		ratio := ""
		if i > 0 {
			ratio = fmt.Sprintf(" (%.2f× the first)", float64(h.heap)/float64(r.heaps[0].heap))
		}
		fmt.Fprintf(w, "| process heap after %d delivered | %.1f MB%s |\n", h.delivered, float64(h.heap)/1e6, ratio)
	}
	for _, t := range r.tables {
		if t.rows > 0 {
			fmt.Fprintf(w, "| events database: `%s`, %d rows (every action of the bench) | %.0f B a row, indexes included |\n", t.name, t.rows, float64(t.bytes)/float64(t.rows))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| time | delivered | stored | etcd in use |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: |")
	for i, s := range r.samples {
		if i%6 == 5 || i == len(r.samples)-1 { // every minute
			fmt.Fprintf(w, "| %s | %d | %d | %.1f MB |\n", s.at.Round(time.Second), s.delivered, s.stored, float64(s.etcd)/1e6)
		}
	}
	fmt.Fprintln(w)
}
