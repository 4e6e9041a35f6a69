package upgrade

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
)

// probeInterval is how often the probe creates an action and calls each RPC on each
// target; probeCallTimeout bounds one call, so that a call that waits (behind a
// migration's lock) counts as failed.
const (
	probeInterval    = 100 * time.Millisecond
	probeCallTimeout = 2 * time.Second
)

// maxFailureRun is the bound of the upgrade's promise to its callers: no RPC fails on
// any target for longer than this in a row (from the first failure of a run to the next
// success). A client retrying with the executor's backoff rides through it.
const maxFailureRun = 2 * time.Second

// outcome is one probe call.
type outcome struct {
	at   time.Time
	took time.Duration
	err  error
	step string // the step of the upgrade the call began in
}

// probe calls every RPC of both services on each of its targets (the services'
// addresses and each replica) and creates an action every probeInterval, keeping every
// outcome by target and RPC.
type probe struct {
	log      func(string, ...any)
	failures *os.File // every failure, one a line, with its time

	mu      sync.Mutex
	step    string               // the step of the upgrade under way
	results map[string][]outcome // "target RPC" -> outcomes, in order
	targets map[string]context.CancelFunc
	wg      sync.WaitGroup
	// created are the actions the probe created (TaskAction names); recorded the events
	// it recorded and the events service acknowledged.
	created  []string
	recorded []*flytecorev1.ActionIdentifier
	// inconsistent are the cache's answers that contradict what was put.
	inconsistent []string
}

func newProbe(failureLog string, log func(string, ...any)) (*probe, error) {
	f, err := os.Create(failureLog)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	return &probe{log: log, failures: f, results: map[string][]outcome{}, targets: map[string]context.CancelFunc{}}, nil
}

// note keeps one outcome.
func (p *probe) note(target, rpc string, at time.Time, err error) {
	took := time.Since(at)
	key := target + " " + rpc
	p.mu.Lock()
	defer p.mu.Unlock()
	prev := p.results[key]
	if err != nil {
		fmt.Fprintf(p.failures, "%s %s %s (%s): %v\n", at.Format("15:04:05.000"), target, rpc, took.Round(time.Millisecond), err)
		if len(prev) == 0 || prev[len(prev)-1].err == nil {
			p.log("probe: %s %s started failing: %v", target, rpc, err)
		}
	} else if n := len(prev); n > 0 && prev[n-1].err != nil {
		first := n - 1
		for first > 0 && prev[first-1].err != nil {
			first--
		}
		p.log("probe: %s %s answers again after %d failures over %s", target, rpc, n-first, at.Sub(prev[first].at).Round(time.Millisecond))
	}
	p.results[key] = append(prev, outcome{at: at, took: took, err: err, step: p.step})
}

// rounds counts the outcomes of every RPC on target since t, failed or not: the fewest
// of any of its RPCs.
func (p *probe) rounds(target string, since time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	fewest := -1
	for key, outs := range p.results {
		if !strings.HasPrefix(key, target+" ") {
			continue
		}
		n := 0
		for _, o := range outs {
			if !o.at.Before(since) {
				n++
			}
		}
		if fewest < 0 || n < fewest {
			fewest = n
		}
	}
	return max(fewest, 0)
}

// successes counts the successful calls of every RPC on target since t: the fewest.
func (p *probe) successes(target string, since time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	fewest := -1
	for key, outs := range p.results {
		if !strings.HasPrefix(key, target+" ") {
			continue
		}
		n := 0
		for _, o := range outs {
			if o.err == nil && !o.at.Before(since) {
				n++
			}
		}
		if fewest < 0 || n < fewest {
			fewest = n
		}
	}
	return max(fewest, 0)
}

// start begins probing a target with each of rounds, every probeInterval, until
// stop(target). Each round runs in a loop of its own, so that an RPC that waits does not
// hold the others back.
func (p *probe) start(ctx context.Context, target string, rounds ...func(ctx context.Context, n int)) {
	ctx, cancel := context.WithCancel(ctx)
	p.mu.Lock()
	if prev := p.targets[target]; prev != nil {
		prev()
	}
	p.targets[target] = cancel
	p.mu.Unlock()
	for _, round := range rounds {
		p.loop(ctx, round)
	}
}

func (p *probe) loop(ctx context.Context, round func(ctx context.Context, n int)) {
	p.wg.Go(func() {
		t := time.NewTicker(probeInterval)
		defer t.Stop()
		for n := 0; ctx.Err() == nil; n++ {
			round(ctx, n)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	})
}

// stop ends the probing of a target (a replica about to be stopped).
func (p *probe) stop(target string) {
	p.mu.Lock()
	cancel := p.targets[target]
	delete(p.targets, target)
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// wait ends every target's probing and waits for it.
func (p *probe) wait() {
	p.mu.Lock()
	for _, cancel := range p.targets {
		cancel()
	}
	p.targets = map[string]context.CancelFunc{}
	p.mu.Unlock()
	p.wg.Wait()
	_ = p.failures.Close()
}

// call runs one RPC with the probe's timeout and keeps its outcome; a call ended by the
// probe's own stop is not kept.
func (p *probe) call(ctx context.Context, target, rpc string, f func(context.Context) error) error {
	at := time.Now()
	cctx, cancel := context.WithTimeout(ctx, probeCallTimeout)
	err := f(cctx)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	p.note(target, rpc, at, err)
	return err
}

// eventsRounds call every RPC of the events service, one a round each: Record (as the
// executor) and the reads and a watch (as a viewer). workload names an action whose
// record they read.
func (p *probe) eventsRounds(target string, writer, reader eventsv1connect.EventsServiceClient, workload *flytecorev1.ActionIdentifier) []func(context.Context, int) {
	record := func(ctx context.Context, n int) {
		id := &flytecorev1.ActionIdentifier{Project: project, Domain: domain, Run: recordRun, Action: fmt.Sprintf("r-%s-%06d", slug(target), n)}
		err := p.call(ctx, target, "Record", func(ctx context.Context) error {
			_, err := writer.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{{
				Id: id, Attempt: 1, Phase: flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, OccurredAt: timestamppb.Now(),
				ReportedAt: timestamppb.Now(), Cluster: "upgrade", TaskType: "probe"}}}))
			return err
		})
		if err == nil {
			p.mu.Lock()
			p.recorded = append(p.recorded, id)
			p.mu.Unlock()
		}
	}
	get := func(ctx context.Context, _ int) {
		_ = p.call(ctx, target, "GetAction", func(ctx context.Context) error {
			_, err := reader.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: workload}))
			return err
		})
	}
	list := func(ctx context.Context, _ int) {
		_ = p.call(ctx, target, "ListActions", func(ctx context.Context) error {
			_, err := reader.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: project, Domain: domain, PageSize: 10}))
			return err
		})
	}
	listEvents := func(ctx context.Context, _ int) {
		_ = p.call(ctx, target, "ListActionEvents", func(ctx context.Context) error {
			_, err := reader.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: workload, PageSize: 100}))
			return err
		})
	}
	// A watch works when the server subscribes it (its headers come then) and it then
	// brings an update or stays open without an error for watchHold.
	watch := func(ctx context.Context, _ int) {
		_ = p.call(ctx, target, "WatchActions", func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err := reader.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: project, Domain: domain}))
			if err != nil {
				return err
			}
			_ = stream.ResponseHeader()
			got := make(chan bool, 1)
			go func() { got <- stream.Receive() }()
			var result error
			select {
			case ok := <-got:
				if err := stream.Err(); !ok && err != nil {
					result = err
				} else if !ok {
					result = errors.New("the stream ended at once")
				}
			case <-time.After(watchHold):
				cancel() // open and quiet: it works; end it
				<-got
			}
			_ = stream.Close()
			return result
		})
	}
	return []func(context.Context, int){record, get, list, listEvents, watch}
}

// watchHold is how long a quiet watch must stay open to count as working.
const watchHold = 500 * time.Millisecond

// cacheRound calls the cache service's RPCs on a fresh key, as the executor uses them
// around a cacheable action: a lookup that misses, a reservation, a put, its release,
// and a lookup that must return what was put.
func (p *probe) cacheRound(target string, c cachev1connect.CacheServiceClient) func(context.Context, int) {
	return func(ctx context.Context, n int) {
		key := &cachev1.CacheKey{Project: project, Domain: domain, TaskName: "upgrade.probe", CacheVersion: "1",
			Signature: "probe", InputsHash: fmt.Sprintf("%s-%06d", slug(target), n)}
		owner := "probe/" + target
		uri := fmt.Sprintf("file:///probe/%s/%06d", slug(target), n)
		_ = p.call(ctx, target, "Get", func(ctx context.Context) error {
			got, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: key}))
			if connect.CodeOf(err) == connect.CodeNotFound {
				return nil
			}
			if err == nil {
				p.inconsistency("%s: Get of the fresh key %s found %s", target, key.GetInputsHash(), got.Msg.GetOutput().GetOutputUri())
			}
			return err
		})
		_ = p.call(ctx, target, "GetOrExtendReservation", func(ctx context.Context) error {
			got, err := c.GetOrExtendReservation(ctx, connect.NewRequest(&cachev1.GetOrExtendReservationRequest{Key: key, OwnerId: owner,
				HeartbeatInterval: durationpb.New(5 * time.Second)}))
			if err == nil && !got.Msg.GetAcquired() {
				p.inconsistency("%s: the reservation of the fresh key %s went to %s", target, key.GetInputsHash(), got.Msg.GetReservation().GetOwnerId())
			}
			return err
		})
		put := p.call(ctx, target, "Put", func(ctx context.Context) error {
			_, err := c.Put(ctx, connect.NewRequest(&cachev1.PutRequest{Key: key, OutputUri: uri, SourceAttempt: 1,
				SourceAction: &flytecorev1.ActionIdentifier{Project: project, Domain: domain, Run: probeRun, Action: "c-" + key.GetInputsHash()}}))
			return err
		})
		_ = p.call(ctx, target, "ReleaseReservation", func(ctx context.Context) error {
			_, err := c.ReleaseReservation(ctx, connect.NewRequest(&cachev1.ReleaseReservationRequest{Key: key, OwnerId: owner}))
			return err
		})
		if put != nil {
			return
		}
		_ = p.call(ctx, target, "Get after Put", func(ctx context.Context) error {
			got, err := c.Get(ctx, connect.NewRequest(&cachev1.GetRequest{Key: key}))
			if err == nil && got.Msg.GetOutput().GetOutputUri() != uri {
				p.inconsistency("%s: Get after Put of %s returned %q, want %q", target, key.GetInputsHash(), got.Msg.GetOutput().GetOutputUri(), uri)
			}
			return err
		})
	}
}

// treeCacheRound calls the cache RPCs the tree added (the tree's executor uses them; the
// previous release's does not, and it is rolled after the services): a lookup that
// reserves the fresh key, a put that releases it, and a lookup that must find it.
func (p *probe) treeCacheRound(target string, c cachev1connect.CacheServiceClient) func(context.Context, int) {
	return func(ctx context.Context, n int) {
		key := &cachev1.CacheKey{Project: project, Domain: domain, TaskName: "upgrade.probe-tree", CacheVersion: "1",
			Signature: "probe", InputsHash: fmt.Sprintf("%s-%06d", slug(target), n)}
		owner := "probe/" + target
		uri := fmt.Sprintf("file:///probe-tree/%s/%06d", slug(target), n)
		err := p.call(ctx, target, "LookupOrReserve", func(ctx context.Context) error {
			got, err := c.LookupOrReserve(ctx, connect.NewRequest(&cachev1.LookupOrReserveRequest{Key: key, OwnerId: owner,
				HeartbeatInterval: durationpb.New(5 * time.Second)}))
			if err == nil && !got.Msg.GetAcquired() {
				p.inconsistency("%s: LookupOrReserve of the fresh key %s did not reserve it", target, key.GetInputsHash())
			}
			return err
		})
		if err != nil {
			return
		}
		err = p.call(ctx, target, "PutAndRelease", func(ctx context.Context) error {
			_, err := c.PutAndRelease(ctx, connect.NewRequest(&cachev1.PutAndReleaseRequest{OwnerId: owner, Put: &cachev1.PutRequest{
				Key: key, OutputUri: uri, SourceAttempt: 1,
				SourceAction: &flytecorev1.ActionIdentifier{Project: project, Domain: domain, Run: probeRun, Action: "t-" + key.GetInputsHash()}}}))
			return err
		})
		if err != nil {
			return
		}
		_ = p.call(ctx, target, "LookupOrReserve after PutAndRelease", func(ctx context.Context) error {
			got, err := c.LookupOrReserve(ctx, connect.NewRequest(&cachev1.LookupOrReserveRequest{Key: key, OwnerId: owner,
				HeartbeatInterval: durationpb.New(5 * time.Second)}))
			if err == nil && got.Msg.GetOutput().GetOutputUri() != uri {
				p.inconsistency("%s: LookupOrReserve after PutAndRelease of %s returned %q, want %q", target, key.GetInputsHash(), got.Msg.GetOutput().GetOutputUri(), uri)
			}
			return err
		})
	}
}

// egressRound calls the CloudEvents egress's ListSinks (as an operator, a group the tree
// added), which must name the test's sink.
func (p *probe) egressRound(target string, c eventsv1connect.EgressServiceClient) func(context.Context, int) {
	return func(ctx context.Context, _ int) {
		_ = p.call(ctx, target, "ListSinks", func(ctx context.Context) error {
			got, err := c.ListSinks(ctx, connect.NewRequest(&eventsv1.ListSinksRequest{}))
			if err == nil && len(got.Msg.GetSinks()) == 0 {
				return errors.New("no sink listed")
			}
			return err
		})
	}
}

func (p *probe) inconsistency(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inconsistent = append(p.inconsistent, fmt.Sprintf(format, args...))
}

// createRound creates one echo action through the API server, as a user would.
func (p *probe) createRound(c client.Client, input, dataDir string) func(context.Context, int) {
	return func(ctx context.Context, n int) {
		name := fmt.Sprintf("p%05d", n)
		ta := &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: flytev1.TaskActionSpec{
			Project: project, Domain: domain, RunName: probeRun, ActionName: name, TaskName: "upgrade.probe", TaskType: "core-echo",
			InputURI: input, RunOutputBase: fileURI(dataDir, "outputs", name)}}
		if p.call(ctx, "kube-apiserver", "create TaskAction", func(ctx context.Context) error { return c.Create(ctx, ta) }) == nil {
			p.mu.Lock()
			p.created = append(p.created, name)
			p.mu.Unlock()
		}
	}
}

// createdActions and recordedEvents are copies of what the probe made.
func (p *probe) createdActions() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.created...)
}

// failureRun is the longest run of consecutive failures of one RPC on one target.
type failureRun struct {
	key, step string
	calls, n  int
	from      time.Time
	span      time.Duration
	// errors are the run's distinct errors (references left out) and how often each
	// came; refs one reference an error of each kind gave, to find its cause by.
	errors map[string]int
	refs   map[string]string
}

// report says, for every target and RPC, its calls, failures and longest run of
// failures, and returns the runs over maxFailureRun.
func (p *probe) report() (lines []string, over []failureRun) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(p.results))
	for k := range p.results {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		outs := p.results[key]
		failed := 0
		var slowest time.Duration
		var worst failureRun
		for i := 0; i < len(outs); i++ {
			slowest = max(slowest, outs[i].took)
			if outs[i].err == nil {
				continue
			}
			j := i
			for j+1 < len(outs) && outs[j+1].err != nil {
				j++
			}
			failed += j - i + 1
			end := outs[j].at.Add(outs[j].took)
			if j+1 < len(outs) {
				end = outs[j+1].at
			}
			run := failureRun{key: key, step: outs[i].step, calls: len(outs), n: j - i + 1, from: outs[i].at, span: end.Sub(outs[i].at),
				errors: map[string]int{}, refs: map[string]string{}}
			for _, o := range outs[i : j+1] {
				msg := o.err.Error()
				kind := refPattern.ReplaceAllString(msg, "under a ref")
				run.errors[kind]++
				run.refs[kind] = msg
			}
			if run.span > worst.span {
				worst = run
			}
			i = j
		}
		line := fmt.Sprintf("%-45s %5d calls, %4d failed, slowest %s", key, len(outs), failed, slowest.Round(time.Millisecond))
		if worst.n > 0 {
			line += fmt.Sprintf("; longest failure run %d calls over %s from %s", worst.n, worst.span.Round(time.Millisecond), worst.from.Format("15:04:05.000"))
			if worst.span > maxFailureRun {
				over = append(over, worst)
			}
		}
		lines = append(lines, line)
	}
	return lines, over
}

// describe says what a run was for a failure message, each kind of error with its count
// and, for an internal one, the cause the service logged (found in logs).
func (r failureRun) describe(logs string) string {
	kinds := make([]string, 0, len(r.errors))
	for k := range r.errors {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return r.errors[kinds[i]] > r.errors[kinds[j]] })
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%dx %s%s", r.errors[k], k, explain(logs, r.refs[k])))
	}
	return fmt.Sprintf("%s failed %d times in a row (of %d calls) over %s from %s, in step %q, over the bound of %s: %s",
		r.key, r.n, r.calls, r.span.Round(time.Millisecond), r.from.Format("15:04:05.000"), r.step, maxFailureRun, strings.Join(parts, "; "))
}

// newEventsClients are a target's writer (the executor's token) and reader (a viewer's).
func newEventsClients(writer, reader *http.Client, url string) (eventsv1connect.EventsServiceClient, eventsv1connect.EventsServiceClient) {
	return eventsv1connect.NewEventsServiceClient(writer, url), eventsv1connect.NewEventsServiceClient(reader, url)
}

// slug is a target's name as the services accept it in identifiers and keys: lower-case
// letters, digits and single dashes (v0.1.0 becomes v0-1-0).
func slug(target string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(target))
}

// during says which step of the upgrade is under way, for the outcomes that follow.
func (p *probe) during(step string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.step = step
}
