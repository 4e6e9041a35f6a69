package sandbox

// CloudEvents egress in the sandbox: a NATS server with JetStream as its own process,
// the stream the events service publishes to, and two consumers in this process (an
// HTTP receiver and a JetStream subscriber) that keep what they get, so that the
// verdict of --until-settled can hold them to the events the service stored.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	cetypes "github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/store"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
)

const (
	// natsStream and natsSubject are where the events service publishes to NATS. The
	// sink never creates a stream: the sandbox does, as an operator would.
	natsStream  = "FLYTE_ACTIONS"
	natsSubject = "flyte.actions"
	// natsDuplicates is the stream's duplicate window (JetStream's default, said out
	// loud): a copy the relay sends again after a failure, within its backoff's 30 s
	// cap, is dropped by its Nats-Msg-Id.
	natsDuplicates = 2 * time.Minute
	// The sinks' names, their cursors' keys in the events service.
	sinkNATS = "nats"
	sinkHTTP = "http"
	// egressCluster names the sandbox in each CloudEvent's source.
	egressCluster = "sandbox"
	// egressSettle bounds how long the verdict waits for the sinks to catch up with the
	// events service once the examples have ended (the relay polls every second).
	egressSettle = 30 * time.Second
)

// egress is what the sandbox runs for the CloudEvents sinks.
type egress struct {
	natsURL, receiverURL string
	// sinksFile is the events service's --cloudevents-config.
	sinksFile string
	// What the JetStream subscriber and the HTTP receiver got.
	nats, http *sinkLog
}

// sinkFlags are the events service's flags for the sandbox's two sinks.
func (e *egress) sinkFlags() []string {
	return []string{"--cloudevents-config", e.sinksFile, "--cloudevents-cluster", egressCluster}
}

// startEgress writes the events service's sinks file into o.Dir, starts nats-server
// with JetStream (its store under o.Dir), creates the stream, and starts the subscriber
// and the HTTP receiver, which write what they get to JSON lines files in logs. Each
// stop is added to stops, to run in reverse.
func startEgress(ctx context.Context, o Options, natsBin, logs string, stops *[]func()) (*egress, error) {
	natsAddr := "127.0.0.1:" + strconv.Itoa(o.NATSPort)
	e := &egress{
		natsURL: "nats://" + natsAddr, receiverURL: fmt.Sprintf("http://127.0.0.1:%d/events", o.CloudEventsReceiverPort),
		sinksFile: filepath.Join(o.Dir, "cloudevents-sinks.yaml"),
	}
	if err := writeYAML(e.sinksFile, cloudevents.File{Sinks: []cloudevents.SinkSpec{
		{Name: sinkNATS, NATS: &cloudevents.NATSSpec{Servers: []string{natsAddr}, Subject: natsSubject, Stream: natsStream}},
		{Name: sinkHTTP, HTTP: &cloudevents.HTTPSpec{URL: e.receiverURL}},
	}}); err != nil {
		return nil, err
	}
	// A run starts with an empty stream, as it does with an empty database: the events
	// of this run have the ids the last run's had, and the duplicate window would drop
	// them as copies.
	storeDir := filepath.Join(o.Dir, "nats")
	if err := os.RemoveAll(storeDir); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	p, err := startProcess("nats-server", natsBin, logs, nil, "--addr", "127.0.0.1", "--port", strconv.Itoa(o.NATSPort),
		"--jetstream", "--store_dir", storeDir, "--server_name", "flyte-sandbox")
	if err != nil {
		return nil, err
	}
	*stops = append(*stops, stopFunc(p))
	err = p.WaitFor(ctx, time.Minute, "serve JetStream on "+e.natsURL+" with stream "+natsStream, func(ctx context.Context) bool {
		return createStream(ctx, e.natsURL) == nil
	})
	if err != nil {
		return nil, err
	}

	natsLog, err := newSinkLog(sinkNATS, filepath.Join(logs, "cloudevents-nats.jsonl"))
	if err != nil {
		return nil, err
	}
	*stops = append(*stops, natsLog.close)
	stop, err := subscribe(ctx, e.natsURL, natsLog)
	if err != nil {
		return nil, err
	}
	*stops = append(*stops, stop)

	httpLog, err := newSinkLog(sinkHTTP, filepath.Join(logs, "cloudevents-http.jsonl"))
	if err != nil {
		return nil, err
	}
	*stops = append(*stops, httpLog.close)
	stop, err = receive(fmt.Sprintf("127.0.0.1:%d", o.CloudEventsReceiverPort), httpLog)
	if err != nil {
		return nil, err
	}
	*stops = append(*stops, stop)
	e.nats, e.http = natsLog, httpLog
	return e, nil
}

// createStream creates (or keeps) the stream the events service publishes to.
func createStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Name("flyte-sandbox setup"), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: natsStream, Subjects: []string{natsSubject}, Storage: jetstream.FileStorage, Duplicates: natsDuplicates,
	})
	return err
}

// subscribe reads the stream from its start with an ordered consumer, as any JetStream
// consumer would, into sl.
func subscribe(ctx context.Context, url string, sl *sinkLog) (stop func(), err error) {
	nc, err := nats.Connect(url, nats.Name("flyte-sandbox subscriber"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("sandbox: subscribing to %s: %w", url, err)
	}
	fail := func(err error) (func(), error) {
		nc.Close()
		return nil, fmt.Errorf("sandbox: subscribing to stream %s: %w", natsStream, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	cons, err := js.OrderedConsumer(ctx, natsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{natsSubject}})
	if err != nil {
		return fail(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var e event.Event
		if err := json.Unmarshal(m.Data(), &e); err != nil {
			sl.refuse(fmt.Errorf("a message that is no CloudEvent: %w", err))
			return
		}
		sl.take(e)
	})
	if err != nil {
		return fail(err)
	}
	return func() { cc.Stop(); nc.Close() }, nil
}

// receive serves an HTTP CloudEvents receiver on addr, at /events, into sl.
func receive(addr string, sl *sinkLog) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sandbox: the CloudEvents receiver: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events", func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 4<<20)
		e, err := cehttp.NewEventFromHTTPRequest(r)
		if err != nil {
			sl.refuse(fmt.Errorf("a request that is no CloudEvent: %w", err))
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sl.take(*e)
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// sinkLog keeps what one sink's consumer got, in arrival order, and writes each event
// as a JSON line (structured mode) to a file a person can follow.
type sinkLog struct {
	name, path string
	mu         sync.Mutex
	file       *os.File
	got        []event.Event
	refused    []string // what arrived that was no CloudEvent
}

func newSinkLog(name, path string) (*sinkLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return &sinkLog{name: name, path: path, file: f}, nil
}

func (s *sinkLog) take(e event.Event) {
	line, err := json.Marshal(e)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, e)
	if err == nil {
		_, err = s.file.Write(append(line, '\n'))
	}
	if err != nil {
		s.refused = append(s.refused, fmt.Sprintf("logging %s: %v", e.ID(), err))
	}
}

func (s *sinkLog) refuse(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused = append(s.refused, err.Error())
}

// events returns what arrived so far, and what arrived that was refused.
func (s *sinkLog) events() ([]event.Event, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got), slices.Clone(s.refused)
}

func (s *sinkLog) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.file.Close()
}

// heldAction is an action the events service holds, with its events in its order.
type heldAction struct {
	key      string // project/domain/run/action
	terminal bool
	events   []*eventsv1.ActionEvent
}

// heldActions reads every action of the examples' project and domain, and its events,
// from the events service.
func heldActions(ctx context.Context, c eventsv1connect.EventsServiceClient) ([]heldAction, error) {
	var out []heldAction
	token := ""
	for {
		resp, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{
			Project: "demo", Domain: "development", PageSize: 1000, PageToken: token,
		}))
		if err != nil {
			return nil, fmt.Errorf("listing the actions: %w", err)
		}
		for _, a := range resp.Msg.GetActions() {
			h := heldAction{key: actionKey(a.GetId()), terminal: store.IsTerminal(a.GetPhase())}
			evs, err := listActionEvents(ctx, c, a.GetId())
			if err != nil {
				return nil, fmt.Errorf("listing the events of %s: %w", h.key, err)
			}
			h.events = evs
			out = append(out, h)
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

func actionKey(id *flytecorev1.ActionIdentifier) string {
	return id.GetProject() + "/" + id.GetDomain() + "/" + id.GetRun() + "/" + id.GetAction()
}

// checkEgress waits until both sinks' consumers got every event the events service
// holds, as it would convert them, each once and in its action's order, and says so
// per sink; or, after egressSettle, fails naming what is wrong.
func checkEgress(ctx context.Context, c eventsv1connect.EventsServiceClient, e *egress, out io.Writer) error {
	deadline := time.Now().Add(egressSettle)
	for {
		held, err := heldActions(ctx, c)
		if err != nil {
			return fmt.Errorf("sandbox: cloudevents: %w", err)
		}
		summaries, failures := []string{}, []string(nil)
		for _, s := range []*sinkLog{e.nats, e.http} {
			got, refused := s.events()
			summary, problems := verdict(s.name, held, got, refused, egressCluster)
			summaries = append(summaries, summary)
			if len(problems) > 0 {
				failures = append(failures, s.name+": "+strings.Join(bounded(problems, 10), "; "))
			}
		}
		if len(held) == 0 { // the examples ran: their events are on their way
			failures = append(failures, "the events service holds no action of the examples")
		}
		// An action still running in the service may have events to come.
		allEnded := !slices.ContainsFunc(held, func(h heldAction) bool { return !h.terminal })
		if len(failures) == 0 && (allEnded || time.Now().After(deadline)) {
			for _, s := range summaries {
				fmt.Fprintln(out, s)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: cloudevents: %d s after the examples ended, the sinks' consumers do not have what the events service holds: %s",
				int(egressSettle.Seconds()), strings.Join(failures, " | "))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// verdict holds what a sink's consumer got to the actions the events service holds:
// every held event arrived once, as Convert makes it (attributes, extensions, data),
// each action's in the order the service lists them, and nothing else. It returns the
// summary line and the problems, each naming its action.
func verdict(sink string, held []heldAction, got []event.Event, refused []string, cluster string) (string, []string) {
	type want struct {
		action int // index in held
		pos    int // in the action's events
		ce     event.Event
		stored *eventsv1.ActionEvent
	}
	var problems []string
	wants := map[string]want{}
	total := 0
	for i, h := range held {
		for j, ev := range h.events {
			ce, err := cloudevents.Convert(ev, cluster)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: event %d cannot be converted: %v", h.key, j, err))
				continue
			}
			wants[ce.ID()] = want{action: i, pos: j, ce: ce, stored: ev}
			total++
		}
	}
	for _, r := range refused {
		problems = append(problems, "got "+r)
	}
	times := map[string]int{}
	arrived := make([][]int, len(held)) // positions, in arrival order, of each action's events
	for _, e := range got {
		w, ok := wants[e.ID()]
		if !ok {
			problems = append(problems, fmt.Sprintf("got %s, which the events service does not hold", e.ID()))
			continue
		}
		if times[e.ID()]++; times[e.ID()] > 1 {
			continue
		}
		arrived[w.action] = append(arrived[w.action], w.pos)
		if diff := differs(w.ce, e, w.stored); diff != "" {
			problems = append(problems, fmt.Sprintf("%s: %s arrived with %s", held[w.action].key, e.ID(), diff))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(times)) {
		if times[id] > 1 {
			problems = append(problems, fmt.Sprintf("%s arrived %d times", id, times[id]))
		}
	}
	for i, h := range held {
		var missing []string
		for j, ev := range h.events {
			if !slices.Contains(arrived[i], j) {
				ce, err := cloudevents.Convert(ev, cluster)
				if err == nil {
					missing = append(missing, ce.ID())
				}
			}
		}
		if len(missing) > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d of its %d events missing: %s", h.key, len(missing), len(h.events), strings.Join(bounded(missing, 3), ", ")))
		}
		for k := 1; k < len(arrived[i]); k++ {
			if before, after := arrived[i][k-1], arrived[i][k]; after < before {
				id := func(pos int) string { ce, _ := cloudevents.Convert(h.events[pos], cluster); return ce.ID() }
				problems = append(problems, fmt.Sprintf("%s: out of order: %s arrived after %s, which comes later in the action", h.key, id(after), id(before)))
				break
			}
		}
	}
	if len(problems) > 0 {
		return "", problems
	}
	return fmt.Sprintf("cloudevents: %s got %d events of %d actions, in order, none missing", sink, total, len(held)), nil
}

// differs names what of a received CloudEvent is not what the events service makes of
// the stored event ("" when nothing is): its attributes, its extensions (compared as
// their canonical strings, since HTTP headers carry them as text) and its data, read
// back into an ActionEvent.
func differs(want, got event.Event, stored *eventsv1.ActionEvent) string {
	var diffs []string
	for _, a := range []struct{ name, want, got string }{
		{"source", want.Source(), got.Source()}, {"type", want.Type(), got.Type()},
		{"subject", want.Subject(), got.Subject()}, {"specversion", want.SpecVersion(), got.SpecVersion()},
		{"datacontenttype", want.DataContentType(), got.DataContentType()},
	} {
		if a.want != a.got {
			diffs = append(diffs, fmt.Sprintf("%s %q (want %q)", a.name, a.got, a.want))
		}
	}
	if !want.Time().Equal(got.Time()) {
		diffs = append(diffs, fmt.Sprintf("time %s (want %s)", got.Time(), want.Time()))
	}
	for _, name := range slices.Sorted(maps.Keys(want.Extensions())) {
		w, _ := cetypes.Format(want.Extensions()[name])
		g, err := cetypes.Format(got.Extensions()[name])
		if err != nil || w != g {
			diffs = append(diffs, fmt.Sprintf("extension %s %q (want %q)", name, g, w))
		}
	}
	var data eventsv1.ActionEvent
	if err := protojson.Unmarshal(got.Data(), &data); err != nil {
		diffs = append(diffs, fmt.Sprintf("data that is no ActionEvent (%v)", err))
	} else if !proto.Equal(&data, stored) {
		diffs = append(diffs, "data other than the stored event")
	}
	return strings.Join(diffs, ", ")
}

// bounded keeps the first n items, and says how many more there were.
func bounded(items []string, n int) []string {
	if len(items) <= n {
		return items
	}
	return append(slices.Clone(items[:n]), fmt.Sprintf("and %d more", len(items)-n))
}
