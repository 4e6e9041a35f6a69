package events_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/store"
	"github.com/flytekube/backend/events/watch"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/servicetest"
)

// The range of time an event may carry: the years 2000 to 2200.
var (
	allowedFrom  = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	allowedUntil = time.Date(2201, 1, 1, 0, 0, 0, 0, time.UTC) // exclusive
)

// maxAttempt is the highest attempt the executor can make: the first, 10 user retries
// (the CRD's maximum) and 100 system failures (the most its configuration allows).
const maxAttempt = 1 + 10 + 100

// refusal is a change to a valid event that Record must refuse, naming field.
type refusal struct {
	name   string
	mutate func(*eventsv1.ActionEvent)
	field  string
}

// requireRefused records each refusal's change of an event made by valid, alone, and
// requires InvalidArgument naming its field.
func requireRefused(t *testing.T, c eventsv1connect.EventsServiceClient, valid func() *eventsv1.ActionEvent, refusals []refusal) {
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			e := valid()
			r.mutate(e)
			servicetest.RequireInvalidArgument(t, recordOne(c, e), r.field)
		})
	}
}

// running1 is a valid event: the first attempt of an action, running.
func running1() *eventsv1.ActionEvent { return event(actionID("r1", "a0"), 1, running, 0, 1) }

func requireNothingStored(t *testing.T, db string) {
	t.Helper()
	if evs, acts := countRows(t, db); evs != 0 || acts != 0 {
		t.Fatalf("refused events wrote %d events and %d actions", evs, acts)
	}
}

func recordOne(c eventsv1connect.EventsServiceClient, e *eventsv1.ActionEvent) error {
	_, err := c.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{e}}))
	return err
}

func ts(seconds int64, nanos int32) *timestamppb.Timestamp {
	return &timestamppb.Timestamp{Seconds: seconds, Nanos: nanos}
}

// The generated clients speak binary protobuf, which carries timestamps the JSON mapping
// could not: every one of them must be refused.
func TestOutOfRangeTimestampsAreRefused(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	inRange := epoch.Unix()
	clusterEventAt := func(at *timestamppb.Timestamp) func(*eventsv1.ActionEvent) {
		return func(e *eventsv1.ActionEvent) {
			e.ClusterEvents = []*eventsv1.ClusterEvent{{OccurredAt: at, Object: "Pod/p", Type: "Normal", Reason: "Started"}}
		}
	}
	tests := []refusal{
		{"occurred_at 1e15 seconds", func(e *eventsv1.ActionEvent) { e.OccurredAt = ts(1e15, 0) }, "events[0].occurred_at"},
		{"occurred_at 2^62 seconds", func(e *eventsv1.ActionEvent) { e.OccurredAt = ts(1<<62, 0) }, "events[0].occurred_at"},
		{"occurred_at at the epoch", func(e *eventsv1.ActionEvent) { e.OccurredAt = ts(0, 0) }, "events[0].occurred_at"},
		{"occurred_at in year 1", func(e *eventsv1.ActionEvent) { e.OccurredAt = timestamppb.New(time.Time{}) }, "events[0].occurred_at"},
		{"occurred_at a nanosecond before 2000", func(e *eventsv1.ActionEvent) { e.OccurredAt = timestamppb.New(allowedFrom.Add(-1)) }, "events[0].occurred_at"},
		{"occurred_at in 2201", func(e *eventsv1.ActionEvent) { e.OccurredAt = timestamppb.New(allowedUntil) }, "events[0].occurred_at"},
		{"occurred_at with negative nanos", func(e *eventsv1.ActionEvent) { e.OccurredAt = ts(inRange, -1) }, "events[0].occurred_at"},
		{"occurred_at with a second of nanos", func(e *eventsv1.ActionEvent) { e.OccurredAt = ts(inRange, 1e9) }, "events[0].occurred_at"},
		{"reported_at 1e15 seconds", func(e *eventsv1.ActionEvent) { e.ReportedAt = ts(1e15, 0) }, "events[0].reported_at"},
		{"reported_at at the epoch", func(e *eventsv1.ActionEvent) { e.ReportedAt = ts(0, 0) }, "events[0].reported_at"},
		{"reported_at with negative nanos", func(e *eventsv1.ActionEvent) { e.ReportedAt = ts(inRange, -1) }, "events[0].reported_at"},
		{"cluster event at 2^62 seconds", clusterEventAt(ts(1<<62, 0)), "events[0].cluster_events[0].occurred_at"},
		{"cluster event in year 1", clusterEventAt(timestamppb.New(time.Time{})), "events[0].cluster_events[0].occurred_at"},
		{"cluster event with a second of nanos", clusterEventAt(ts(inRange, 1e9)), "events[0].cluster_events[0].occurred_at"},
	}
	requireRefused(t, inst.client, running1, tests)
	requireNothingStored(t, db)
}

// listAllEvents pages through an action's events with pageSize, failing if the listing
// does not end within maxPages.
func listAllEvents(t *testing.T, c eventsv1connect.EventsServiceClient, id *flytecorev1.ActionIdentifier, pageSize uint32, maxPages int, eachPage func(*eventsv1.ListActionEventsResponse)) []*eventsv1.ActionEvent {
	t.Helper()
	var all []*eventsv1.ActionEvent
	token := ""
	for range maxPages {
		resp, err := c.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: pageSize, PageToken: token}))
		if err != nil {
			t.Fatalf("ListActionEvents: %v", err)
		}
		if eachPage != nil {
			eachPage(resp.Msg)
		}
		all = append(all, resp.Msg.GetEvents()...)
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return all
		}
	}
	t.Fatalf("listing did not end within %d pages; got %d events so far", maxPages, len(all))
	return nil
}

// requireEachOnce fails unless got holds exactly the events of want (by identity), each once.
func requireEachOnce(t *testing.T, got, want []*eventsv1.ActionEvent) {
	t.Helper()
	identity := func(e *eventsv1.ActionEvent) string {
		return fmt.Sprintf("attempt %d %s v%d", e.GetAttempt(), e.GetPhase(), e.GetVersion())
	}
	seen := map[string]int{}
	for _, e := range got {
		seen[identity(e)]++
	}
	for _, e := range want {
		if n := seen[identity(e)]; n != 1 {
			t.Errorf("%s (at %s) listed %d times; want once", identity(e), e.GetOccurredAt().AsTime().Format(time.RFC3339Nano), n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("listed %d events; want %d", len(got), len(want))
	}
}

// Page tokens hold the position of the last event listed. Events at the edges of the
// allowed range, and those stored before the range was enforced (at the epoch, before
// 1678 or after 2262, where nanoseconds since the epoch overflow), must each be listed
// exactly once.
func TestEventPaginationAtTheEdgesOfTime(t *testing.T) {
	at := func(e *eventsv1.ActionEvent, when time.Time) *eventsv1.ActionEvent {
		e.OccurredAt = timestamppb.New(when)
		return e
	}
	t.Run("recorded at the edges of the allowed range", func(t *testing.T) {
		inst := startInstance(t, pg.NewDatabase(t))
		id := actionID("edges", "a0")
		evs := []*eventsv1.ActionEvent{
			at(event(id, 1, queued, 0, 0), allowedFrom),
			at(event(id, 1, running, 0, 0), allowedFrom),
			at(event(id, 1, running, 1, 0), allowedFrom.Add(time.Microsecond)),
			at(event(id, 1, failed, 0, 0), allowedUntil.Add(-time.Microsecond)),
			at(event(id, 2, queued, 0, 0), allowedFrom),
			at(event(id, 2, running, 0, 0), allowedUntil.Add(-time.Nanosecond)),
			at(event(id, 2, succeeded, 0, 0), allowedUntil.Add(-time.Nanosecond)),
		}
		record(t, inst.client, evs...)
		requireEachOnce(t, listAllEvents(t, inst.client, id, 1, 2*len(evs), nil), evs)
	})
	t.Run("stored before the range was enforced", func(t *testing.T) {
		db := pg.NewDatabase(t)
		inst := startInstance(t, db)
		_, pool := openStore(t, db)
		id := actionID("legacy", "a0")
		evs := []*eventsv1.ActionEvent{
			at(event(id, 1, queued, 0, 0), time.Time{}),
			at(event(id, 1, running, 0, 0), time.Unix(0, 0)),
			at(event(id, 1, running, 1, 0), time.Unix(0, 0)),
			at(event(id, 1, running, 2, 0), time.Date(1677, 6, 1, 0, 0, 0, 0, time.UTC)),
			at(event(id, 1, running, 3, 0), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)),
			at(event(id, 2, queued, 0, 0), time.Unix(0, 0)),
			at(event(id, 2, succeeded, 0, 0), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)),
		}
		for _, e := range evs {
			encoded, err := proto.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			// Filed as the table's rows from before it was partitioned are.
			_, err = pool.Exec(context.Background(), `INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event, filed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, '-infinity')`, id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction(),
				int32(e.GetAttempt()), int16(e.GetPhase()), int32(e.GetVersion()), e.GetOccurredAt().AsTime(), encoded)
			if err != nil {
				t.Fatal(err)
			}
		}
		last := evs[len(evs)-1]
		if _, err := pool.Exec(context.Background(), `INSERT INTO actions (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event, filed_at)
VALUES ($1, $2, $3, $4, 2, $5, 0, 5, $6, $6, '', '-infinity')`, id.GetProject(), id.GetDomain(), id.GetRun(), id.GetAction(),
			int16(last.GetPhase()), last.GetOccurredAt().AsTime()); err != nil {
			t.Fatal(err)
		}
		requireEachOnce(t, listAllEvents(t, inst.client, id, 1, 2*len(evs), nil), evs)
	})
}

// An attempt the executor cannot make is a forgery, and a version that does not fit its
// column would be stored negative, so that a newer version loses.
func TestForgedAttemptsAndOverflowingVersionsAreRefused(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	tests := []refusal{
		{"one attempt more than the executor makes", func(e *eventsv1.ActionEvent) { e.Attempt = maxAttempt + 1 }, "events[0].attempt"},
		{"attempt 10000", func(e *eventsv1.ActionEvent) { e.Attempt = 10000 }, "events[0].attempt"},
		{"version 2^31", func(e *eventsv1.ActionEvent) { e.Version = 1 << 31 }, "events[0].version"},
		{"version 2^32-1", func(e *eventsv1.ActionEvent) { e.Version = math.MaxUint32 }, "events[0].version"},
	}
	requireRefused(t, inst.client, running1, tests)
	requireNothingStored(t, db)

	t.Run("the largest of each is stored and wins", func(t *testing.T) {
		id := actionID("r1", "largest")
		record(t, inst.client, event(id, maxAttempt, running, 5, 1), event(id, maxAttempt, running, math.MaxInt32, 2))
		if got := getAction(t, inst.client, id); got.GetAttempt() != maxAttempt || got.GetVersion() != math.MaxInt32 {
			t.Fatalf("action is %s; want attempt %d version %d", stateString(got), maxAttempt, math.MaxInt32)
		}
	})
}

// withUnknownField appends a field numbered 1000 of n bytes that m's schema does not name.
func withUnknownField(m proto.Message, n int) {
	r := m.ProtoReflect()
	b := protowire.AppendTag(r.GetUnknown(), 1000, protowire.BytesType)
	b = protowire.AppendBytes(b, bytes.Repeat([]byte{'u'}, n))
	r.SetUnknown(b)
}

// unknownBytes counts the bytes of unknown fields in m and every message it holds.
func unknownBytes(m protoreflect.Message) int {
	n := len(m.GetUnknown())
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				n += unknownBytes(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			n += unknownBytes(v.Message())
		}
		return true
	})
	return n
}

// A NUL byte or invalid UTF-8 in any string is refused before the database, naming the
// field; so are log links without a name or a URI, or with a URI longer than 2048 bytes.
func TestBadTextIsRefused(t *testing.T) {
	db := pg.NewDatabase(t)
	inst := startInstance(t, db)
	full := func() *eventsv1.ActionEvent {
		e := event(actionID("r1", "a0"), 1, failed, 0, 1)
		e.Cluster, e.OutputsUri, e.Message = "east", "s3://bucket/out", "failed"
		e.Error = &flytecorev1.ExecutionError{Code: "OOMKilled", Kind: flytecorev1.ExecutionError_KIND_USER, Message: "out of memory"}
		e.ClusterEvents = []*eventsv1.ClusterEvent{{OccurredAt: e.GetOccurredAt(), Object: "Pod/p", Type: "Warning", Reason: "OOMKilling", Message: "killed", Source: "kubelet"}}
		e.LogLinks = []*eventsv1.LogLink{{Name: "Kubernetes", Uri: "https://logs.example.com/p"}}
		return e
	}
	const nul = "a\x00b"
	tests := []refusal{
		{"NUL in reason", func(e *eventsv1.ActionEvent) { e.Reason = nul }, "events[0].reason"},
		{"NUL in message", func(e *eventsv1.ActionEvent) { e.Message = nul }, "events[0].message"},
		{"NUL in cluster", func(e *eventsv1.ActionEvent) { e.Cluster = nul }, "events[0].cluster"},
		{"NUL in outputs_uri", func(e *eventsv1.ActionEvent) { e.OutputsUri = "s3://b/" + nul }, "events[0].outputs_uri"},
		{"NUL in task_type", func(e *eventsv1.ActionEvent) { e.TaskType = nul }, "events[0].task_type"},
		{"NUL in error code", func(e *eventsv1.ActionEvent) { e.Error.Code = nul }, "events[0].error.code"},
		{"NUL in error message", func(e *eventsv1.ActionEvent) { e.Error.Message = nul }, "events[0].error.message"},
		{"NUL in cluster event object", func(e *eventsv1.ActionEvent) { e.ClusterEvents[0].Object = nul }, "events[0].cluster_events[0].object"},
		{"NUL in cluster event type", func(e *eventsv1.ActionEvent) { e.ClusterEvents[0].Type = nul }, "events[0].cluster_events[0].type"},
		{"NUL in cluster event reason", func(e *eventsv1.ActionEvent) { e.ClusterEvents[0].Reason = nul }, "events[0].cluster_events[0].reason"},
		{"NUL in cluster event message", func(e *eventsv1.ActionEvent) { e.ClusterEvents[0].Message = nul }, "events[0].cluster_events[0].message"},
		{"NUL in cluster event source", func(e *eventsv1.ActionEvent) { e.ClusterEvents[0].Source = nul }, "events[0].cluster_events[0].source"},
		{"cluster event source of 129 bytes", func(e *eventsv1.ActionEvent) { e.ClusterEvents[0].Source = strings.Repeat("x", 129) }, "events[0].cluster_events[0].source"},
		{"NUL in log link name", func(e *eventsv1.ActionEvent) { e.LogLinks[0].Name = nul }, "events[0].log_links[0].name"},
		{"NUL in log link URI", func(e *eventsv1.ActionEvent) { e.LogLinks[0].Uri = "https://l/" + nul }, "events[0].log_links[0].uri"},
		{"NUL in project", func(e *eventsv1.ActionEvent) { e.Id.Project = nul }, "events[0].id.project"},
		{"log link without a name", func(e *eventsv1.ActionEvent) { e.LogLinks[0].Name = "" }, "events[0].log_links[0].name"},
		{"log link without a URI", func(e *eventsv1.ActionEvent) { e.LogLinks[0].Uri = "" }, "events[0].log_links[0].uri"},
		{"log link URI of 2049 bytes", func(e *eventsv1.ActionEvent) {
			e.LogLinks[0].Uri = "https://logs.example.com/" + strings.Repeat("x", 2049-len("https://logs.example.com/"))
		}, "events[0].log_links[0].uri"},
	}
	requireRefused(t, inst.client, full, tests)
	t.Run("invalid UTF-8 sent as binary protobuf", func(t *testing.T) {
		e := full()
		e.Reason = "PLACEHOLDER"
		body, err := proto.Marshal(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{e}})
		if err != nil {
			t.Fatal(err)
		}
		// proto.Marshal refuses invalid UTF-8, so it goes in after encoding.
		body = bytes.Replace(body, []byte("PLACEHOLDER"), []byte("\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\xf7\xf6\xf5"), 1)
		servicetest.RequireInvalidArgument(t, inst.PostUnary(t, "/flyte.events.v1.EventsService/Record", body), "events[0].reason")
	})
	requireNothingStored(t, db)
}

// maximalEvent fills every field of an event to the contract's bounds.
func maximalEvent(id *flytecorev1.ActionIdentifier, version uint32) *eventsv1.ActionEvent {
	text := func(n int) string { return strings.Repeat("x", n) }
	e := event(id, 1, running, version, int(version))
	e.ReportedAt = e.GetOccurredAt()
	e.Cluster, e.OutputsUri, e.Reason, e.Message, e.TaskType = text(253), "s3://"+text(2043), text(256), text(65536), text(128)
	e.CacheStatus = flytecorev1.CacheStatus_CACHE_STATUS_MISS
	e.Error = &flytecorev1.ExecutionError{Code: text(256), Kind: flytecorev1.ExecutionError_KIND_SYSTEM, Message: text(65536)}
	for range 100 {
		e.ClusterEvents = append(e.ClusterEvents, &eventsv1.ClusterEvent{
			OccurredAt: e.GetOccurredAt(), Object: text(512), Type: text(32), Reason: text(256), Message: text(4096), Source: text(128), Count: math.MaxUint32,
		})
	}
	for range 20 {
		e.LogLinks = append(e.LogLinks, &eventsv1.LogLink{Name: text(128), Uri: "https://logs.example.com/" + text(2048-len("https://logs.example.com/"))})
	}
	return e
}

const defaultMaxResponseBytes = 4 << 20

// A page of maximal events stops at the response cap with a token for the next, and the
// pages still list every event once.
func TestListingsStayUnderTheResponseCap(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	t.Run("ListActionEvents", func(t *testing.T) {
		id := actionID("big", "a0")
		var evs []*eventsv1.ActionEvent
		for b := range 5 {
			var batch []*eventsv1.ActionEvent
			for i := range 4 {
				batch = append(batch, maximalEvent(id, uint32(4*b+i)))
			}
			record(t, inst.client, batch...)
			evs = append(evs, batch...)
		}
		t.Logf("%d events of %d bytes each", len(evs), proto.Size(evs[0]))
		pages := 0
		listed := listAllEvents(t, inst.client, id, 1000, len(evs)+1, func(page *eventsv1.ListActionEventsResponse) {
			pages++
			if size := proto.Size(page); size > defaultMaxResponseBytes {
				t.Errorf("page %d holds %d events in %d bytes; want at most %d", pages, len(page.GetEvents()), size, defaultMaxResponseBytes)
			}
			if len(page.GetEvents()) == 0 {
				t.Errorf("page %d is empty", pages)
			}
		})
		requireEachOnce(t, listed, evs)
	})
	t.Run("ListActions", func(t *testing.T) {
		// An action's state carries the two longest texts of its event.
		var want []string
		for b := range 3 {
			var batch []*eventsv1.ActionEvent
			for i := range 20 {
				e := event(actionID("wide", fmt.Sprintf("a%d-%d", b, i)), 1, failed, 0, i)
				e.Message = strings.Repeat("m", 65536)
				e.Error = &flytecorev1.ExecutionError{Code: "Boom", Kind: flytecorev1.ExecutionError_KIND_USER, Message: strings.Repeat("e", 65536)}
				batch = append(batch, e)
				want = append(want, e.GetId().GetAction())
			}
			record(t, inst.client, batch...)
		}
		seen := map[string]int{}
		token := ""
		for page := 1; ; page++ {
			if page > len(want)+1 {
				t.Fatal("listing did not end")
			}
			resp, err := inst.client.ListActions(context.Background(), connect.NewRequest(&eventsv1.ListActionsRequest{
				Project: "demo", Domain: "development", Run: "wide", PageSize: 1000, PageToken: token,
			}))
			if err != nil {
				t.Fatal(err)
			}
			if size := proto.Size(resp.Msg); size > defaultMaxResponseBytes || len(resp.Msg.GetActions()) == 0 {
				t.Errorf("page %d holds %d actions in %d bytes; want 1 to %d bytes", page, len(resp.Msg.GetActions()), size, defaultMaxResponseBytes)
			}
			for _, a := range resp.Msg.GetActions() {
				seen[a.GetId().GetAction()]++
			}
			if token = resp.Msg.GetNextPageToken(); token == "" {
				break
			}
		}
		for _, a := range want {
			if seen[a] != 1 {
				t.Errorf("action %s listed %d times; want once", a, seen[a])
			}
		}
	})
}

// openWatchFor opens a watch without waiting: refusals show as the stream's error.
func openWatchFor(ctx context.Context, c eventsv1connect.EventsServiceClient) *connect.ServerStreamForClient[eventsv1.WatchActionsResponse] {
	stream, err := c.WatchActions(ctx, connect.NewRequest(&eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"}))
	if err != nil {
		panic(err) // the client only fails here on a bad URL
	}
	return stream
}

func TestWatcherLimits(t *testing.T) {
	tests := []struct {
		name                    string
		perService, perIdentity int
		refused                 string
	}{
		{"per service", 3, 100, `flyte_events_watchers_refused_total{limit="service"} 1`},
		{"per identity", 100, 3, `flyte_events_watchers_refused_total{limit="identity"} 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst := startInstance(t, pg.NewDatabase(t), func(c *events.Config) {
				c.MaxWatchers, c.MaxWatchersPerIdentity = tt.perService, tt.perIdentity
			})
			req := &eventsv1.WatchActionsRequest{Project: "demo", Domain: "development"}
			_, closeFirst := openWatch(t, inst, req)
			openWatch(t, inst, req)
			openWatch(t, inst, req)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			extra := openWatchFor(ctx, inst.client)
			for extra.Receive() {
			}
			if connect.CodeOf(extra.Err()) != connect.CodeResourceExhausted {
				t.Fatalf("the fourth watcher ended with %v; want ResourceExhausted", extra.Err())
			}
			inst.RequireMetrics(t, tt.refused)

			// A place given back can be taken again.
			closeFirst()
			if !inst.WaitForMetric(t, "flyte_events_watchers 2") {
				t.Fatal("the closed watcher was never counted out")
			}
			again, _ := openWatch(t, inst, req)
			record(t, inst.client, event(actionID("r1", "a0"), 1, running, 0, 1))
			if !again.Receive() {
				t.Fatalf("the watcher opened in the freed place ended: %v", again.Err())
			}
		})
	}
}

// watchHandlers counts goroutines running the WatchActions handler.
func watchHandlers() int {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Count(buf, []byte("(*Service).WatchActions("))
}

// Watchers whose clients never read, while events keep coming, are ended by the hub when
// their buffers fill, and their handlers, blocked sending into a full HTTP/2 window, end
// when the write stalls past the server's limit: neither they nor their goroutines
// outlive the drop.
func TestStalledWatchersAreDroppedWithTheirGoroutines(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t), func(c *events.Config) {
		c.WatchBuffer = 4
		c.Server.WriteStallTimeout = 500 * time.Millisecond
	})
	record(t, inst.client, event(actionID("warm", "a0"), 1, running, 0, 1))
	// The CloudEvents relay's goroutines start once it leads; counted before the watchers.
	if !inst.WaitForMetric(t, "flyte_events_cloudevents_leader 1") {
		t.Fatal("the relay never led")
	}
	baseline := runtime.NumGoroutine()

	// Small receive windows make a non-reading client stall the server after a few
	// updates rather than after 4 MiB each.
	small := servicetest.H2CClient()
	small.Transport.(*http.Transport).HTTP2.MaxReceiveBufferPerStream = 16 << 10
	stalled := eventsv1connect.NewEventsServiceClient(small, inst.URL, connect.WithGRPC())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const watchers = 50
	var streams []*connect.ServerStreamForClient[eventsv1.WatchActionsResponse]
	for range watchers {
		s := openWatchFor(ctx, stalled)
		_ = s.ResponseHeader() // established; never read from again
		streams = append(streams, s)
	}
	if !inst.WaitForMetric(t, fmt.Sprintf("flyte_events_watchers %d", watchers)) {
		t.Fatalf("%d watchers never opened", watchers)
	}

	// Each update is larger than a watcher's window, even compressed: its first send blocks.
	random := make([]byte, 48<<10)
	_, _ = rand.Read(random)
	message := base64.StdEncoding.EncodeToString(random)
	left, b := 0, 0
	eventually.True(t, 20*time.Second, func() bool {
		if left = watchHandlers(); left == 0 {
			return true
		}
		var batch []*eventsv1.ActionEvent
		for i := range 5 {
			e := event(actionID("flood", fmt.Sprintf("a%d-%d", b, i)), 1, running, 0, b)
			e.Message = message
			batch = append(batch, e)
		}
		// The stall timeout is short, so on a loaded machine the server may end a Record
		// whose answer it could not write in time; the next round records again.
		if _, err := inst.client.Record(context.Background(), connect.NewRequest(&eventsv1.RecordRequest{Events: batch})); err != nil {
			t.Logf("Record (recorded again next round): %v", err)
		}
		b++
		return false
	}, func() string {
		return fmt.Sprintf("%d of %d stalled watchers' handlers still run after events", left, watchers)
	})
	inst.RequireMetrics(t, "flyte_events_watchers 0")

	cancel()
	for _, s := range streams {
		_ = s.Close()
	}
	small.CloseIdleConnections()
	eventually.True(t, 20*time.Second, func() bool { return runtime.NumGoroutine() <= baseline+5 }, func() string {
		return fmt.Sprintf("%d goroutines after the watchers were dropped; %d before they opened", runtime.NumGoroutine(), baseline)
	})
}

// The store checks again what the contract says, for events that reach it without the
// server's validation: each is refused naming its field, and the batch writes nothing.
func TestStoreRefusesWhatItCannotHold(t *testing.T) {
	db := pg.NewDatabase(t)
	st, _ := openStore(t, db)
	tests := []refusal{
		{"attempt 0", func(e *eventsv1.ActionEvent) { e.Attempt = 0 }, "events[1].attempt"},
		{"attempt beyond the executor's", func(e *eventsv1.ActionEvent) { e.Attempt = maxAttempt + 1 }, "events[1].attempt"},
		{"version 2^31", func(e *eventsv1.ActionEvent) { e.Version = 1 << 31 }, "events[1].version"},
		{"unspecified phase", func(e *eventsv1.ActionEvent) { e.Phase = 0 }, "events[1].phase"},
		{"phase beyond smallint", func(e *eventsv1.ActionEvent) { e.Phase = 70000 }, "events[1].phase"},
		{"no identifier", func(e *eventsv1.ActionEvent) { e.Id = nil }, "events[1].id"},
		{"uppercase project", func(e *eventsv1.ActionEvent) { e.Id.Project = "Demo" }, "events[1].id.project"},
		{"slash in run", func(e *eventsv1.ActionEvent) { e.Id.Run = "a/b" }, "events[1].id.run"},
		{"no occurred_at", func(e *eventsv1.ActionEvent) { e.OccurredAt = nil }, "events[1].occurred_at"},
		{"occurred_at 1e15 seconds", func(e *eventsv1.ActionEvent) { e.OccurredAt = ts(1e15, 0) }, "events[1].occurred_at"},
		{"occurred_at with negative nanos", func(e *eventsv1.ActionEvent) { e.OccurredAt.Nanos = -1 }, "events[1].occurred_at"},
		{"reported_at with a second of nanos", func(e *eventsv1.ActionEvent) { e.ReportedAt = ts(epoch.Unix(), 1e9) }, "events[1].reported_at"},
		{"cluster event in year 1", func(e *eventsv1.ActionEvent) {
			e.ClusterEvents = []*eventsv1.ClusterEvent{{OccurredAt: e.GetOccurredAt()}, {OccurredAt: timestamppb.New(time.Time{})}}
		}, "events[1].cluster_events[1].occurred_at"},
		{"NUL in reason", func(e *eventsv1.ActionEvent) { e.Reason = "a\x00b" }, "events[1].reason"},
		{"invalid UTF-8 in message", func(e *eventsv1.ActionEvent) { e.Message = "a\xffb" }, "events[1].message"},
		{"NUL in error message", func(e *eventsv1.ActionEvent) {
			e.Error = &flytecorev1.ExecutionError{Code: "X", Message: "\x00"}
		}, "events[1].error.message"},
		{"NUL in log link URI", func(e *eventsv1.ActionEvent) {
			e.LogLinks = []*eventsv1.LogLink{{Name: "logs", Uri: "https://l/\x00"}}
		}, "events[1].log_links[0].uri"},
		{"event larger than the store holds", func(e *eventsv1.ActionEvent) { e.Message = strings.Repeat("m", 4<<20) }, "events[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := event(actionID("r1", "a1"), 1, running, 0, 1)
			tt.mutate(bad)
			_, err := st.Record(context.Background(), []*eventsv1.ActionEvent{event(actionID("r1", "a0"), 1, running, 0, 1), bad})
			var refused *store.InvalidEventError
			if !errors.As(err, &refused) || refused.Field != tt.field {
				t.Fatalf("got %v; want the store to refuse %s", err, tt.field)
			}
		})
	}
	requireNothingStored(t, db)
}

// A page takes items while they fit its byte budget, and always one: every item is
// listed once whatever the sizes, including items larger than the budget.
func TestStorePagesHonourTheirByteBudget(t *testing.T) {
	db := pg.NewDatabase(t)
	st, _ := openStore(t, db)
	const budget = 10 << 10
	sizes := []int{12 << 10, 1 << 10, 4 << 10, 4 << 10, 11 << 10, 11 << 10, 100, 100, 9 << 10, 5 << 10, 5 << 10, 1 << 10}
	id := actionID("budget", "a0")
	var evs []*eventsv1.ActionEvent
	for i, size := range sizes {
		e := event(id, 1, running, uint32(i), i)
		e.Message = strings.Repeat("m", size)
		evs = append(evs, e)
	}
	if _, err := st.Record(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{1, 2, 3, 1000} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			var (
				listed []*eventsv1.ActionEvent
				after  store.EventCursor
			)
			for pages := 0; ; pages++ {
				if pages > len(sizes) {
					t.Fatal("listing did not end")
				}
				rows, more, err := st.ListActionEvents(context.Background(), store.KeyOf(id), nil, after, store.Page{Limit: limit, MaxBytes: budget})
				if err != nil {
					t.Fatal(err)
				}
				total := 0
				for _, r := range rows {
					total += proto.Size(r.Event) + store.ItemOverhead
					listed = append(listed, r.Event)
				}
				if len(rows) == 0 || len(rows) > limit || (len(rows) > 1 && total > budget) {
					t.Fatalf("page %d holds %d events in %d bytes; want 1 to %d events within %d bytes, or one", pages, len(rows), total, limit, budget)
				}
				if !more {
					break
				}
				after = rows[len(rows)-1].Cursor
			}
			requireEachOnce(t, listed, evs)
		})
	}
}

// One caller's watches do not take another's places: the per-identity limit counts each
// identity apart, and a closed watch gives its place back.
func TestWatcherLimitIsPerIdentity(t *testing.T) {
	db := pg.NewDatabase(t)
	st, pool := openStore(t, db)
	var refused []string
	hub := watch.NewHub(pool, st, watch.Config{Buffer: 8, MaxWatchers: 5, MaxWatchersPerIdentity: 2},
		slog.New(slog.DiscardHandler), watch.Metrics{Refused: func(limit string) { refused = append(refused, limit) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = hub.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	subscribe := func(identity string) (*watch.Subscription, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return hub.Subscribe(ctx, watch.Filter{Project: "demo", Domain: "development"}, identity)
	}
	mustSubscribe := func(identity string) *watch.Subscription {
		t.Helper()
		s, err := subscribe(identity)
		if err != nil {
			t.Fatalf("subscribing as %s: %v", identity, err)
		}
		return s
	}
	alice := mustSubscribe("alice")
	mustSubscribe("alice")
	if _, err := subscribe("alice"); !errors.Is(err, watch.ErrTooManyWatchers) {
		t.Fatalf("alice's third watch: %v; want ErrTooManyWatchers", err)
	}
	mustSubscribe("bob")
	mustSubscribe("bob")
	mustSubscribe("carol")
	if _, err := subscribe("dave"); !errors.Is(err, watch.ErrTooManyWatchers) {
		t.Fatalf("the sixth watch: %v; want ErrTooManyWatchers", err)
	}
	hub.Unsubscribe(alice)
	mustSubscribe("alice")
	if strings.Join(refused, ",") != "identity,service" {
		t.Fatalf("refusals counted %v; want [identity service]", refused)
	}
}

// schemaLeaf is a place in an event's schema: a string, a timestamp or a message, reached
// through fields (lists through their first element).
type schemaLeaf struct {
	path  string
	steps []protoreflect.FieldDescriptor
	kind  string // "string", "timestamp" or "message"
}

// schemaLeaves lists every string, timestamp and message of md's schema, md included.
func schemaLeaves(md protoreflect.MessageDescriptor, path string, steps []protoreflect.FieldDescriptor) []schemaLeaf {
	if md.FullName() == "google.protobuf.Timestamp" {
		return []schemaLeaf{{path, steps, "timestamp"}, {path, steps, "message"}}
	}
	leaves := []schemaLeaf{{path, steps, "message"}}
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		name := path + "." + string(fd.Name())
		if fd.IsList() {
			name += "[0]"
		}
		next := append(slices.Clone(steps), fd)
		switch fd.Kind() {
		case protoreflect.StringKind:
			leaves = append(leaves, schemaLeaf{name, next, "string"})
		case protoreflect.MessageKind:
			leaves = append(leaves, schemaLeaves(fd.Message(), name, next)...)
		}
	}
	return leaves
}

// reach returns the message a leaf's steps lead to from m, creating what is missing, and
// the last field when the leaf is a string.
func reach(m protoreflect.Message, steps []protoreflect.FieldDescriptor) (protoreflect.Message, protoreflect.FieldDescriptor) {
	for _, fd := range steps {
		if fd.Kind() != protoreflect.MessageKind {
			return m, fd
		}
		if fd.IsList() {
			list := m.Mutable(fd).List()
			if list.Len() == 0 {
				list.AppendMutable()
			}
			m = list.Get(0).Message()
		} else {
			m = m.Mutable(fd).Message()
		}
		if ts, ok := m.Interface().(*timestamppb.Timestamp); ok && ts.GetSeconds() == 0 {
			ts.Seconds = epoch.Unix() // a new timestamp would otherwise be the (refused) epoch
		}
	}
	return m, nil
}

// The store checks every string and timestamp of an event and keeps the unknown fields of
// every message in it (a newer release's), whatever fields the schema gains: this walks
// the schema rather than a list of fields.
func TestStoreChecksEveryStringAndTimestamp(t *testing.T) {
	db := pg.NewDatabase(t)
	st, pool := openStore(t, db)
	leaves := schemaLeaves((&eventsv1.ActionEvent{}).ProtoReflect().Descriptor(), "events[0]", nil)
	for i, leaf := range leaves {
		t.Run(leaf.kind+" "+leaf.path, func(t *testing.T) {
			e := event(actionID("schema", fmt.Sprintf("a%d", i)), 1, running, 0, 1)
			m, fd := reach(e.ProtoReflect(), leaf.steps)
			switch leaf.kind {
			case "string":
				m.Set(fd, protoreflect.ValueOfString("a\x00b"))
			case "timestamp":
				m.Interface().(*timestamppb.Timestamp).Nanos = -1
			case "message":
				withUnknownField(m.Interface(), 10)
			}
			_, err := st.Record(context.Background(), []*eventsv1.ActionEvent{e})
			if leaf.kind != "message" {
				var refused *store.InvalidEventError
				if !errors.As(err, &refused) || refused.Field != leaf.path {
					t.Fatalf("got %v; want the store to refuse %s", err, leaf.path)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var encoded []byte
			if err := pool.QueryRow(context.Background(), `SELECT event FROM action_events WHERE action = $1`, e.GetId().GetAction()).Scan(&encoded); err != nil {
				t.Fatal(err)
			}
			var stored eventsv1.ActionEvent
			if err := proto.Unmarshal(encoded, &stored); err != nil {
				t.Fatal(err)
			}
			if n, want := unknownBytes(stored.ProtoReflect()), protowire.SizeTag(1000)+protowire.SizeBytes(10); n != want {
				t.Fatalf("stored %d bytes of unknown fields; want the %d sent", n, want)
			}
		})
	}
}
