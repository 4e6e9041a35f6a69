package eventsbench

// CloudEvents egress, end to end: the events service runs in-process as its binary does,
// its relay publishing to real sinks in this process (an HTTP receiver, an embedded
// nats-server with JetStream, franz-go's kfake Kafka-protocol broker), each read by a
// consumer that stamps when every event arrives. Three measurements:
//
//   - publish throughput: a backlog recorded while no relay leads (the bench holds the
//     leadership), then drained by the service's relay, per sink and all at once;
//   - Record's maximum rate without and with the three sinks, then the lag from each
//     Record's acknowledgement to each event's arrival at half that rate;
//   - a slow sink (answering after a delay, or 503 always) against none: Record's rate.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flytekube/backend/bench/benchutil"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/outbox"
	"github.com/flytekube/backend/events/relay"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
)

// EgressSize sizes the egress part.
type EgressSize struct {
	// Batch is the events per Record.
	Batch int
	// Backlog is the events recorded before the relay drains them, per publish
	// measurement.
	Backlog int
	// MaxFor is how long Record runs flat out to find its maximum rate, per setup and
	// round.
	MaxFor time.Duration
	// PacedFor is how long Record runs at half that rate for the lag.
	PacedFor time.Duration
	// PacedRate, when positive, is the paced rate instead (events per second).
	PacedRate float64
	// SlowEvents is the events recorded per setup and round beside a slow sink.
	SlowEvents int
	// SlowDelay is how long the slow HTTP sink takes to answer.
	SlowDelay time.Duration
	// DrainTimeout bounds the wait for a consumer to hold every event.
	DrainTimeout time.Duration
	// Sinks are the sinks of the maximum rate and the lag ("http", "nats", "kafka");
	// none means all three.
	Sinks []string
	// HTTPMode is the HTTP sinks' content mode (binary, structured or batch; empty:
	// binary, the sink's default).
	HTTPMode string
}

// SinkKinds are the names EgressSize.Sinks takes.
var SinkKinds = []string{"http", "nats", "kafka"}

// lagSinks are the sinks of the maximum rate and the lag.
func (s EgressSize) lagSinks() []sinkKind {
	if len(s.Sinks) == 0 {
		return allSinks
	}
	var out []sinkKind
	for i, name := range SinkKinds {
		if slices.Contains(s.Sinks, name) {
			out = append(out, allSinks[i])
		}
	}
	return out
}

// sinkKind is a sink the egress part can configure.
type sinkKind int

const (
	kindHTTP sinkKind = iota
	kindNATS
	kindKafka
	// tracked is the number of kinds whose consumers stamp each event's arrival: the
	// kinds above.
	tracked
	kindSlowHTTP        = tracked
	kindUnavailableHTTP = tracked + 1
)

var kindNames = map[sinkKind]string{
	kindHTTP:            "HTTP",
	kindNATS:            "NATS JetStream",
	kindKafka:           "Kafka (kfake)",
	kindSlowHTTP:        "HTTP answering late",
	kindUnavailableHTTP: "HTTP answering 503",
}

var allSinks = []sinkKind{kindHTTP, kindNATS, kindKafka}

const (
	natsSubject = "flyte.actions"
	kafkaTopic  = "flyte-actions"
	// leaderApp is the application_name of the relay leadership's session
	// (events/outbox), by which the bench sees which relay leads.
	leaderApp = "flyte-events-relay-leader"
	// censored stands for the lag of an event that never arrived.
	censored = 24 * time.Hour
)

// ceID is the CloudEvent id cloudevents.Convert gives ev, computed without encoding the
// event (checkIDs holds it to Convert's).
func ceID(ev *eventsv1.ActionEvent) string {
	id := ev.GetId()
	phase, _ := cloudevents.PhaseName(ev.GetPhase())
	return id.GetProject() + "/" + id.GetDomain() + "/" + id.GetRun() + "/" + id.GetAction() + "/" +
		strconv.FormatUint(uint64(ev.GetAttempt()), 10) + "/" + phase + "/" + strconv.FormatUint(uint64(ev.GetVersion()), 10)
}

func idsOf(b []*eventsv1.ActionEvent) []string {
	out := make([]string, len(b))
	for i, ev := range b {
		out[i] = ceID(ev)
	}
	return out
}

// checkIDs fails when ceID and Convert disagree on an event of every benchmark phase.
func checkIDs() error {
	for _, ev := range generate("check", len(phases), 1) {
		ce, err := cloudevents.Convert(ev, "bench")
		if err != nil {
			return err
		}
		if ce.ID() != ceID(ev) {
			return fmt.Errorf("the bench expects CloudEvent id %q, Convert gives %q", ceID(ev), ce.ID())
		}
	}
	return nil
}

// collector matches what the consumers receive with what the clients recorded. Times
// are nanoseconds since base, plus one, so that 0 means "not yet".
type collector struct {
	mu      sync.Mutex
	base    time.Time
	ids     map[string]int32 // CloudEvent id → event number
	batchOf []int32          // event number → batch number
	sent    []int64          // batch → when its Record was sent
	acked   []int64          // batch → when its Record returned
	arrived [tracked][]int64 // sink → event number → first arrival
	count   [tracked]int     // events arrived, each once
	dups    [tracked]int     // arrivals of an event already arrived
	strays  [tracked]int     // arrivals of events not recorded here
	bad     [tracked]int     // messages that were not CloudEvents
}

func newCollector() *collector {
	return &collector{base: time.Now(), ids: map[string]int32{}}
}

func (c *collector) stamp(t time.Time) int64 { return int64(t.Sub(c.base)) + 1 }

// expect registers a batch about to be sent and returns its number.
func (c *collector) expect(ids []string) int {
	now := c.stamp(time.Now())
	c.mu.Lock()
	defer c.mu.Unlock()
	b := len(c.sent)
	c.sent = append(c.sent, now)
	c.acked = append(c.acked, 0)
	for _, id := range ids {
		c.ids[id] = int32(len(c.batchOf))
		c.batchOf = append(c.batchOf, int32(b))
	}
	for s := range c.arrived {
		c.arrived[s] = append(c.arrived[s], make([]int64, len(ids))...)
	}
	return b
}

// ack stamps batch b's Record as returned.
func (c *collector) ack(b int) {
	now := c.stamp(time.Now())
	c.mu.Lock()
	c.acked[b] = now
	c.mu.Unlock()
}

// arrive stamps the event id as received by sink's consumer at at.
func (c *collector) arrive(sink sinkKind, id string, at time.Time) {
	t := c.stamp(at)
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.ids[id]
	switch {
	case !ok:
		c.strays[sink]++
	case c.arrived[sink][n] != 0:
		c.dups[sink]++
	default:
		c.arrived[sink][n] = t
		c.count[sink]++
	}
}

func (c *collector) undecodable(sink sinkKind) {
	c.mu.Lock()
	c.bad[sink]++
	c.mu.Unlock()
}

// counts returns the events each sink's consumer holds, and how many were recorded.
func (c *collector) counts() (got [tracked]int, want int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count, len(c.batchOf)
}

// wait returns once each of sinks' consumers holds every event recorded, or after
// timeout, reporting which.
func (c *collector) wait(ctx context.Context, sinks []sinkKind, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		got, want := c.counts()
		done := true
		for _, s := range sinks {
			done = done && got[s] == want
		}
		if done {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lastArrival is when sink's consumer received its last event.
func (c *collector) lastArrival(sink sinkKind) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(time.Duration(slices.Max(c.arrived[sink]) - 1))
}

// problems describes what a consumer received that it should not have.
func (c *collector) problems(sinks []sinkKind) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sinks {
		if c.bad[s] > 0 || c.strays[s] > 0 {
			return fmt.Errorf("%s: %d messages that are not CloudEvents, %d events nobody recorded", kindNames[s], c.bad[s], c.strays[s])
		}
	}
	return nil
}

// Lag is one sink's delivery lag in a paced run.
type Lag struct {
	Sink sinkKind
	// Events were recorded, Missing of them never arrived (within the drain timeout),
	// Duplicates arrived again.
	Events, Missing, Duplicates int
	// From the Record's return to the event's arrival (negative when the event arrived
	// before the client had the answer), and P99Sent from the Record's sending.
	P50, P99, Max, P99Sent time.Duration
}

// lag computes sink's lag; an event that never arrived counts as censored.
func (c *collector) lag(sink sinkKind) Lag {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := Lag{Sink: sink, Events: len(c.batchOf), Duplicates: c.dups[sink]}
	fromAck := make([]time.Duration, 0, len(c.batchOf))
	fromSent := make([]time.Duration, 0, len(c.batchOf))
	for n, at := range c.arrived[sink] {
		b := c.batchOf[n]
		if at == 0 {
			l.Missing++
			fromAck, fromSent = append(fromAck, censored), append(fromSent, censored)
			continue
		}
		fromAck = append(fromAck, time.Duration(at-c.acked[b]))
		fromSent = append(fromSent, time.Duration(at-c.sent[b]))
	}
	l.P50, l.P99, l.P99Sent = benchutil.Percentile(fromAck, 0.5), benchutil.Percentile(fromAck, 0.99), benchutil.Percentile(fromSent, 0.99)
	if len(fromAck) > 0 {
		l.Max = slices.Max(fromAck)
	}
	return l
}

// recordLatency is the Records' latencies, from sending to return.
func (c *collector) recordLatency() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Duration, len(c.sent))
	for b := range c.sent {
		out[b] = time.Duration(c.acked[b] - c.sent[b])
	}
	return out
}

// rig is one measurement's sinks, their consumers and the events service publishing to
// them.
type rig struct {
	// name labels the rig's goroutines in a CPU profile (as), with their role.
	name    string
	col     *collector
	sinks   []cloudevents.Config
	svc     *service
	closers []func()
	// slowServed counts the events the late and the unavailable receivers answered.
	slowServed int64
	slowMu     sync.Mutex
}

func (r *rig) onClose(f func()) { r.closers = append(r.closers, f) }

// as runs f, and the goroutines it starts, with the profiler labels egress=<the rig's
// name> (drain http, drain nats, drain kafka, drain all, max none, max sinks, paced,
// slow none, slow late, slow 503) and role=role: service (the events service and its
// relay, the sinks' clients among it), sinks (receivers, brokers and their consumers)
// or clients (Record's). nats-server labels its own goroutines instead.
func (r *rig) as(role string, f func()) {
	pprof.Do(context.Background(), pprof.Labels("egress", r.name, "role", role), func(context.Context) { f() })
}

// stop stops the service, then the consumers and the sinks.
func (r *rig) stop() {
	if r.svc != nil {
		_ = r.svc.stop()
	}
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
	r.closers = nil
}

// names are the rig's sink names, sorted.
func (r *rig) names() []string {
	out := make([]string, len(r.sinks))
	for i, s := range r.sinks {
		out[i] = s.Name()
	}
	slices.Sort(out)
	return out
}

// egress runs the part.
type egress struct {
	o        Options
	size     EgressSize
	pool     *pgxpool.Pool
	box      *outbox.Outbox
	progress io.Writer
	meter    benchutil.CPUMeter
}

// startRig starts the sinks of kinds, their consumers, and the service configured with
// them (whose relay leads at once unless the bench holds the leadership).
func (e *egress) startRig(ctx context.Context, name string, kinds []sinkKind) (r *rig, err error) {
	r = &rig{name: name, col: newCollector()}
	defer func() {
		if err != nil {
			r.stop()
		}
	}()
	var httpAddr string
	for _, k := range kinds {
		var spec cloudevents.SinkSpec
		r.as("sinks", func() {
			switch k {
			case kindNATS:
				spec.Name = "nats"
				if spec.NATS, err = r.startNATS(ctx); err != nil {
					err = fmt.Errorf("NATS: %w", err)
				}
			case kindKafka:
				spec.Name = "kafka"
				if spec.Kafka, err = r.startKafka(); err != nil {
					err = fmt.Errorf("Kafka: %w", err)
				}
			default:
				if httpAddr == "" {
					if httpAddr, err = r.startReceiver(e.size.SlowDelay); err != nil {
						err = fmt.Errorf("HTTP receiver: %w", err)
						return
					}
				}
				at := map[sinkKind]struct{ name, path string }{
					kindHTTP: {"http", "/events"}, kindSlowHTTP: {"http-slow", "/slow"}, kindUnavailableHTTP: {"http-unavailable", "/unavailable"},
				}[k]
				spec = cloudevents.SinkSpec{Name: at.name, HTTP: &cloudevents.HTTPSpec{URL: "http://" + httpAddr + at.path, Mode: cloudevents.Mode(e.size.HTTPMode)}}
			}
		})
		if err != nil {
			return nil, err
		}
		sc, err := spec.Config()
		if err != nil {
			return nil, err
		}
		r.sinks = append(r.sinks, sc)
	}
	cfg := events.Config{
		Listen: "127.0.0.1:0", DatabaseURL: e.o.DatabaseURL, Auth: auth.Config{Mode: auth.ModeNone},
		// The relay at its defaults: Poll, Batch, Backoff, LeaderCheck.
		CloudEvents: relay.Config{Sinks: r.sinks, Cluster: "bench"},
	}
	var (
		url  string
		stop func() error
	)
	r.as("service", func() { url, stop, err = benchutil.StartService(ctx, events.Run, cfg) })
	if err != nil {
		return nil, err
	}
	r.svc = &service{stop: stop}
	for _, h := range benchutil.Clients(e.o.Clients, "") {
		r.svc.clients = append(r.svc.clients, eventsv1connect.NewEventsServiceClient(h, url))
	}
	return r, nil
}

// startReceiver serves the HTTP sinks on 127.0.0.1: /events decodes each request with
// the SDK and stamps the event's arrival, /slow answers after delay, /unavailable
// answers 503.
func (r *rig) startReceiver(delay time.Duration) (string, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events", func(w http.ResponseWriter, req *http.Request) {
		at := time.Now()
		var (
			evs []event.Event
			err error
		)
		if cehttp.IsHTTPBatch(req.Header) {
			evs, err = cehttp.NewEventsFromHTTPRequest(req)
		} else {
			var ev *event.Event
			if ev, err = cehttp.NewEventFromHTTPRequest(req); err == nil {
				evs = []event.Event{*ev}
			}
		}
		if err != nil {
			r.col.undecodable(kindHTTP)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for i := range evs {
			r.col.arrive(kindHTTP, evs[i].ID(), at)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /slow", func(w http.ResponseWriter, req *http.Request) {
		n := eventsIn(req)
		select {
		case <-req.Context().Done():
			return
		case <-time.After(delay):
		}
		r.countServed(n)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /unavailable", func(w http.ResponseWriter, req *http.Request) {
		r.countServed(eventsIn(req))
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	r.onClose(func() { _ = srv.Close() })
	return lis.Addr().String(), nil
}

func (r *rig) countServed(events int) {
	r.slowMu.Lock()
	r.slowServed += int64(events)
	r.slowMu.Unlock()
}

// eventsIn reads a request's body and says how many events it carried: those of a
// batch, else one.
func eventsIn(req *http.Request) int {
	if !cehttp.IsHTTPBatch(req.Header) {
		_, _ = io.Copy(io.Discard, req.Body)
		return 1
	}
	evs, err := cehttp.NewEventsFromHTTPRequest(req)
	if err != nil {
		return 1
	}
	return len(evs)
}

// served is the number of events the late and the unavailable receivers answered.
func (r *rig) served() int {
	r.slowMu.Lock()
	defer r.slowMu.Unlock()
	return int(r.slowServed)
}

// startNATS runs a nats-server with JetStream (a file store in a temporary directory),
// the stream over the subject, and an ordered consumer decoding each message; it
// returns the sink of the subject.
func (r *rig) startNATS(ctx context.Context) (*cloudevents.NATSSpec, error) {
	dir, err := os.MkdirTemp("", "events-bench-nats-")
	if err != nil {
		return nil, err
	}
	r.onClose(func() { _ = os.RemoveAll(dir) })
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir})
	if err != nil {
		return nil, err
	}
	srv.Start()
	r.onClose(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("the server did not start")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return nil, err
	}
	r.onClose(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// As the sandbox and compose create it: a two-minute duplicate window.
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLYTE_ACTIONS", Subjects: []string{natsSubject}, Duplicates: 2 * time.Minute})
	if err != nil {
		return nil, err
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	// The id comes from the header the sink sets ("<source> <id>"), and one message in
	// 64 is decoded in full and held to it: decoding every one would take CPU from the
	// service, which shares the cores.
	var seen int
	cc, err := cons.Consume(func(m jetstream.Msg) {
		at := time.Now()
		_, id, _ := strings.Cut(m.Headers().Get(jetstream.MsgIDHeader), " ")
		if seen++; seen%64 == 1 {
			var ev event.Event
			if err := format.JSON.Unmarshal(m.Data(), &ev); err != nil || ev.ID() != id {
				r.col.undecodable(kindNATS)
				return
			}
		}
		r.col.arrive(kindNATS, id, at)
	})
	if err != nil {
		return nil, err
	}
	r.onClose(cc.Stop)
	return &cloudevents.NATSSpec{Servers: []string{srv.Addr().String()}, Subject: natsSubject}, nil
}

// startKafka runs a one-broker kfake cluster with the topic in 4 partitions, and a
// consumer of the topic reading each record's ce_id; it returns the sink of the topic.
func (r *rig) startKafka() (*cloudevents.KafkaSpec, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, kafkaTopic))
	if err != nil {
		return nil, err
	}
	r.onClose(cluster.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(kafkaTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			at := time.Now()
			fetches.EachRecord(func(rec *kgo.Record) {
				id, ct := "", ""
				for _, h := range rec.Headers {
					switch h.Key {
					case "ce_id":
						id = string(h.Value)
					case "content-type":
						ct = string(h.Value)
					}
				}
				if id == "" || ct != event.ApplicationJSON {
					r.col.undecodable(kindKafka)
					return
				}
				r.col.arrive(kindKafka, id, at)
			})
		}
	}()
	r.onClose(func() { cancel(); <-done; cl.Close() })
	return &cloudevents.KafkaSpec{Brokers: cluster.ListenAddrs(), Topic: kafkaTopic}, nil
}

// reset empties the events and the outbox while no service runs.
func (e *egress) reset(ctx context.Context) error {
	for _, q := range []string{
		"ALTER TABLE action_events ENABLE TRIGGER queue_recorded_events",
		"TRUNCATE event_outbox, cloudevent_dead_letters",
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	if err := truncate(ctx, e.pool); err != nil {
		return err
	}
	_, err := e.pool.Exec(ctx, "VACUUM ANALYZE event_outbox")
	return err
}

// leaderHeld says whether a relay's session other than except holds the leadership.
func (e *egress) leaderHeld(ctx context.Context, except uint32) (bool, error) {
	var held bool
	err := e.pool.QueryRow(ctx, `SELECT EXISTS (
		SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1 AND l.pid <> $2)`,
		leaderApp, int64(except)).Scan(&held)
	return held, err
}

// waitRelay waits until the service's relay leads with exactly names registered.
func (e *egress) waitRelay(ctx context.Context, names []string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		held, err := e.leaderHeld(ctx, 0)
		if err != nil {
			return err
		}
		var registered []string
		if err := e.pool.QueryRow(ctx, "SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM cloudevent_sinks").Scan(&registered); err != nil {
			return err
		}
		if held && slices.Equal(registered, names) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay did not lead with sinks %v within 30s (leading: %v, registered: %v)", names, held, registered)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// queued is the number of events in the outbox.
func (e *egress) queued(ctx context.Context) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, "SELECT coalesce(sum(count), 0) FROM event_outbox").Scan(&n)
	return n, err
}

// record sends one batch and checks every event was new.
func record(ctx context.Context, c eventsv1connect.EventsServiceClient, b []*eventsv1.ActionEvent) error {
	resp, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: b}))
	if err == nil && int(resp.Msg.GetRecorded()) != len(b) {
		err = fmt.Errorf("recorded %d of %d new events", resp.Msg.GetRecorded(), len(b))
	}
	return err
}

// Drain is one publish-throughput measurement: a backlog drained to Sinks.
type Drain struct {
	Sinks []sinkKind
	// RecordPerSecond is Record's rate while recording the backlog (the outbox filling,
	// no relay leading).
	RecordPerSecond float64
	// Takeover is from the bench's release of the leadership to the service's relay
	// holding it; Drain counts from then.
	Takeover time.Duration
	// Drain is, per sink, until its consumer held every event.
	Drain [tracked]time.Duration
	// Duplicates is, per sink, events its consumer received more than once.
	Duplicates [tracked]int
}

// drain measures publish throughput to kinds.
func (e *egress) drain(ctx context.Context, kinds []sinkKind, label, prefix string) (Drain, error) {
	res := Drain{Sinks: kinds}
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	// Holding the leadership keeps the service's relay standing by: the backlog builds.
	var lead *outbox.Leadership
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if lead, err = e.box.TryLead(ctx); err == nil {
			break
		}
		if !errors.Is(err, outbox.ErrLedElsewhere) || time.Now().After(deadline) {
			return res, fmt.Errorf("taking the relay's leadership: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer func() { _ = lead.Release(context.WithoutCancel(ctx)) }()
	r, err := e.startRig(ctx, label, kinds)
	if err != nil {
		return res, err
	}
	defer r.stop()
	if _, err := e.pool.Exec(ctx, "DELETE FROM cloudevent_sinks"); err != nil { // exactly the rig's sinks
		return res, err
	}
	if _, err := e.box.AddSinks(ctx, r.names()); err != nil {
		return res, err
	}

	evs := generate(prefix, e.size.Backlog, 100)
	bs := batches(evs, e.size.Batch)
	for _, b := range bs {
		r.col.expect(idsOf(b))
	}
	var d time.Duration
	r.as("clients", func() {
		d, err = fanOut(e.o.Clients, bs, func(c int, b []*eventsv1.ActionEvent) error { return record(ctx, r.svc.clients[c], b) })
	})
	if err != nil {
		return res, fmt.Errorf("recording the backlog: %w", err)
	}
	res.RecordPerSecond = float64(len(evs)) / d.Seconds()
	if n, err := e.queued(ctx); err != nil || n != len(evs) {
		return res, fmt.Errorf("%d events queued of %d recorded (%v)", n, len(evs), err)
	}
	if got, _ := r.col.counts(); got != [tracked]int{} {
		return res, fmt.Errorf("events were published while the bench held the leadership: %v", got)
	}

	released := time.Now()
	pid := lead.PID()
	if err := lead.Release(ctx); err != nil {
		return res, err
	}
	var start time.Time
	for {
		held, err := e.leaderHeld(ctx, pid)
		if err != nil {
			return res, err
		}
		if held {
			start = time.Now()
			break
		}
		if time.Since(released) > 30*time.Second {
			return res, errors.New("the service's relay did not take the leadership within 30s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	res.Takeover = start.Sub(released)
	if !r.col.wait(ctx, kinds, e.size.DrainTimeout) {
		got, want := r.col.counts()
		return res, fmt.Errorf("not drained within %s: consumers hold %v of %d events", e.size.DrainTimeout, got, want)
	}
	if err := r.col.problems(kinds); err != nil {
		return res, err
	}
	for _, k := range kinds {
		res.Drain[k] = r.col.lastArrival(k).Sub(start)
		res.Duplicates[k] = r.col.dups[k]
	}
	return res, nil
}

// MaxRun is Record flat out in one setup.
type MaxRun struct {
	PerSecond float64
	CPU       benchutil.CPUUse // per event
	// Delivered is, per sink, the share of the recorded events its consumer held when
	// the load stopped.
	Delivered [tracked]float64
	// Latency is Record's, per call.
	P50, P99 time.Duration
}

// runMax runs Record flat out for size.MaxFor in rig r.
func (e *egress) runMax(ctx context.Context, r *rig, kinds []sinkKind, prefix string) (MaxRun, error) {
	var res benchutil.Result
	used, err := e.meter.Measure(func() (err error) {
		r.as("clients", func() {
			res, err = benchutil.RunFor(ctx, e.o.Clients, e.size.MaxFor, func(ctx context.Context, c, i int) error {
				b := generate(fmt.Sprintf("%s-c%d-%d", prefix, c, i), e.size.Batch, e.size.Batch)
				n := r.col.expect(idsOf(b))
				err := record(ctx, r.svc.clients[c], b)
				r.col.ack(n)
				return err
			})
		})
		return err
	})
	if err != nil {
		return MaxRun{}, err
	}
	got, want := r.col.counts()
	out := MaxRun{PerSecond: float64(want) / res.Elapsed.Seconds(), CPU: used.Per(want), P50: res.Percentile(0.5), P99: res.Percentile(0.99)}
	for _, k := range kinds {
		out.Delivered[k] = float64(got[k]) / float64(want)
	}
	return out, nil
}

// Paced is Record at a set rate, with each sink's lag.
type Paced struct {
	Target, PerSecond float64
	Duration          time.Duration
	RecordP50         time.Duration
	RecordP99         time.Duration
	Lags              []Lag
	// Drained is whether every consumer held every event within the drain timeout.
	Drained bool
}

// runPaced runs Record at rate events per second for size.PacedFor in rig r: every
// client sends a batch on each tick of its own ticker, the clients' ticks spread evenly.
func (e *egress) runPaced(ctx context.Context, r *rig, kinds []sinkKind, rate float64, prefix string) (Paced, error) {
	interval := time.Duration(float64(e.o.Clients*e.size.Batch) / rate * float64(time.Second))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	start := time.Now()
	stop := start.Add(e.size.PacedFor)
	for c := range e.o.Clients {
		r.as("clients", func() {
			wg.Go(func() {
				time.Sleep(time.Duration(c) * interval / time.Duration(e.o.Clients))
				t := time.NewTicker(interval)
				defer t.Stop()
				end := time.NewTimer(time.Until(stop))
				defer end.Stop()
				for i := 0; ; i++ {
					b := generate(fmt.Sprintf("%s-c%d-%d", prefix, c, i), e.size.Batch, e.size.Batch)
					n := r.col.expect(idsOf(b))
					err := record(ctx, r.svc.clients[c], b)
					r.col.ack(n)
					if err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						return
					}
					select {
					case <-t.C:
					case <-end.C:
						return
					}
				}
			})
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return Paced{}, first
	}
	_, want := r.col.counts()
	out := Paced{Target: rate, PerSecond: float64(want) / elapsed.Seconds(), Duration: elapsed}
	lat := r.col.recordLatency()
	out.RecordP50, out.RecordP99 = benchutil.Percentile(lat, 0.5), benchutil.Percentile(lat, 0.99)
	out.Drained = r.col.wait(ctx, kinds, e.size.DrainTimeout)
	if err := r.col.problems(kinds); err != nil {
		return out, err
	}
	for _, k := range kinds {
		out.Lags = append(out.Lags, r.col.lag(k))
	}
	return out, nil
}

// setup is a configuration of sinks that Record is measured in.
type setup struct {
	name  string
	label string // its profiler label, after the comparison's
	kinds []sinkKind
}

// Rounds are a comparison's rounds: each runs every setup, rotating which goes first.
type Rounds struct {
	Setups []string
	// PerSecond, Ratios (each over the first setup's rate in the same round) and CPU
	// (per event) are per setup, per round.
	PerSecond, Ratios [][]float64
	CPU               [][]benchutil.CPUUse
	// Runs are the runs of the sinks setup, when there is one.
	Runs []MaxRun
}

// median of a setup's figures.
func (r Rounds) median(xs [][]float64, i int) float64 { return benchutil.Median(xs[i]) }

// cpu is a setup's CPU per event over its rounds.
func (r Rounds) cpu(i int) benchutil.CPUUse {
	total := benchutil.CPUUse{}
	for _, u := range r.CPU[i] {
		total = total.Add(u, 1)
	}
	return total.Per(len(r.CPU[i]))
}

// compare runs each setup in rounds; measure runs one setup in a started rig.
func (e *egress) compare(ctx context.Context, what string, setups []setup, measure func(r *rig, s setup, prefix string) (float64, benchutil.CPUUse, error)) (Rounds, error) {
	n := len(setups)
	out := Rounds{PerSecond: make([][]float64, n), Ratios: make([][]float64, n), CPU: make([][]benchutil.CPUUse, n)}
	for _, s := range setups {
		out.Setups = append(out.Setups, s.name)
	}
	for round := range e.o.Rounds {
		rate := make([]float64, n)
		for k := range n {
			i := (k + round) % n
			s := setups[i]
			fmt.Fprintf(e.progress, "egress: %s, round %d, %s\n", what, round+1, s.name)
			if err := e.reset(ctx); err != nil {
				return out, err
			}
			r, err := e.startRig(ctx, what+" "+s.label, s.kinds)
			if err != nil {
				return out, fmt.Errorf("%s: %w", s.name, err)
			}
			if err := e.waitRelay(ctx, r.names()); err != nil {
				r.stop()
				return out, fmt.Errorf("%s: %w", s.name, err)
			}
			perSecond, used, err := measure(r, s, fmt.Sprintf("%s%d-%d", what[:1], round, i))
			r.stop()
			if err != nil {
				return out, fmt.Errorf("%s: %w", s.name, err)
			}
			rate[i] = perSecond
			out.PerSecond[i] = append(out.PerSecond[i], perSecond)
			out.CPU[i] = append(out.CPU[i], used)
		}
		for i := range n {
			out.Ratios[i] = append(out.Ratios[i], rate[i]/rate[0])
		}
	}
	return out, nil
}

// EgressResult is everything the egress part measured.
type EgressResult struct {
	Drains []Drain
	Max    Rounds
	Paced  Paced
	Slow   Rounds
}

// Egress runs the egress part. No other events service may run on the database.
func Egress(ctx context.Context, o Options, pool *pgxpool.Pool, progress io.Writer) (EgressResult, error) {
	if err := checkIDs(); err != nil {
		return EgressResult{}, err
	}
	if s := o.EgressSize; s.Batch < 1 || s.Backlog < 1 || s.SlowEvents < 1 || s.MaxFor <= 0 || s.PacedFor <= 0 {
		return EgressResult{}, fmt.Errorf("egress sizes must be positive: %+v", s)
	}
	e := &egress{o: o, size: o.EgressSize, pool: pool, box: outbox.New(pool), progress: progress,
		meter: benchutil.CPUMeter{Groups: map[string]func(benchutil.Proc) bool{}}}
	if o.Postgres != nil {
		e.meter.Groups[postgresGroup] = o.Postgres
	}
	defer func() {
		// Leave no sink registered, so that nothing is queued after the bench.
		_, _ = e.pool.Exec(context.WithoutCancel(ctx), "DELETE FROM cloudevent_sinks")
	}()
	var res EgressResult

	// 1. Publish throughput: a backlog drained to each sink, then to all three.
	for i, to := range []struct {
		label string
		kinds []sinkKind
	}{{"drain http", []sinkKind{kindHTTP}}, {"drain nats", []sinkKind{kindNATS}}, {"drain kafka", []sinkKind{kindKafka}}, {"drain all", allSinks}} {
		kinds := to.kinds
		fmt.Fprintf(progress, "egress: draining %d events to %s\n", e.size.Backlog, sinkList(kinds))
		d, err := e.drain(ctx, kinds, to.label, fmt.Sprintf("d%d", i))
		if err != nil {
			return res, fmt.Errorf("draining to %s: %w", sinkList(kinds), err)
		}
		res.Drains = append(res.Drains, d)
	}

	// 2. Record's maximum rate without and with the sinks, then the lag at half of it.
	var (
		err  error
		runs []MaxRun
	)
	lagSinks := e.size.lagSinks()
	res.Max, err = e.compare(ctx, "max", []setup{{"no sink", "none", nil}, {sinkList(lagSinks), "sinks", lagSinks}},
		func(r *rig, s setup, prefix string) (float64, benchutil.CPUUse, error) {
			m, err := e.runMax(ctx, r, s.kinds, prefix)
			if err == nil && len(s.kinds) > 0 {
				runs = append(runs, m)
			}
			return m.PerSecond, m.CPU, err
		})
	if err != nil {
		return res, fmt.Errorf("maximum rate: %w", err)
	}
	res.Max.Runs = runs
	half := res.Max.median(res.Max.PerSecond, 1) / 2
	if e.size.PacedRate > 0 {
		half = e.size.PacedRate
	}
	fmt.Fprintf(progress, "egress: Record paced at %.0f events/s for %s\n", half, e.size.PacedFor)
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	r, err := e.startRig(ctx, "paced", lagSinks)
	if err != nil {
		return res, err
	}
	err = e.waitRelay(ctx, r.names())
	if err == nil {
		res.Paced, err = e.runPaced(ctx, r, lagSinks, half, "p")
	}
	r.stop()
	if err != nil {
		return res, fmt.Errorf("paced: %w", err)
	}

	// 3. A slow sink against none.
	res.Slow, err = e.compare(ctx, "slow", []setup{
		{"no sink", "none", nil},
		{fmt.Sprintf("an HTTP sink answering after %s", e.size.SlowDelay), "late", []sinkKind{kindSlowHTTP}},
		{"an HTTP sink answering 503", "503", []sinkKind{kindUnavailableHTTP}},
	}, func(r *rig, s setup, prefix string) (float64, benchutil.CPUUse, error) {
		evs := generate(prefix, e.size.SlowEvents, 100)
		var d time.Duration
		used, err := e.meter.Measure(func() (err error) {
			r.as("clients", func() {
				d, err = fanOut(e.o.Clients, batches(evs, e.size.Batch), func(c int, b []*eventsv1.ActionEvent) error {
					return record(ctx, r.svc.clients[c], b)
				})
			})
			return err
		})
		if err != nil {
			return 0, nil, err
		}
		// The setup held: with the slow sink, the outbox filled (less what it took).
		n, err := e.queued(ctx)
		if err != nil {
			return 0, nil, err
		}
		if want := len(evs); (len(s.kinds) == 0 && n != 0) || (len(s.kinds) > 0 && n < want-r.served()) {
			return 0, nil, fmt.Errorf("%d events queued of %d recorded", n, want)
		}
		return float64(len(evs)) / d.Seconds(), used.Per(len(evs)), nil
	})
	if err != nil {
		return res, fmt.Errorf("slow sink: %w", err)
	}
	return res, nil
}

func sinkList(kinds []sinkKind) string {
	var names []string
	for _, k := range kinds {
		names = append(names, kindNames[k])
	}
	if len(names) == 0 {
		return "no sink"
	}
	return strings.Join(names, ", ")
}

// ms formats a duration in milliseconds, or as censored.
func ms(d time.Duration) string {
	if d >= censored {
		return "not delivered"
	}
	if x := float64(d) / float64(time.Millisecond); x < 100 && x > -100 {
		return fmt.Sprintf("%.1fms", x)
	}
	return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
}

func percents(xs []float64) string {
	var each []string
	for _, x := range xs {
		each = append(each, fmt.Sprintf("%.0f%%", 100*x))
	}
	return strings.Join(each, " ")
}

// WriteEgress writes the egress part's figures as Markdown.
func WriteEgress(w io.Writer, o Options, r EgressResult) {
	s := o.EgressSize
	fmt.Fprintf(w, "\n### CloudEvents egress: publish throughput, a backlog of %d events (batches of %d from %d clients, recorded while no relay led)\n\n", s.Backlog, s.Batch, o.Clients)
	httpMode := s.HTTPMode
	if httpMode == "" {
		httpMode = "binary"
	}
	fmt.Fprintf(w, "The HTTP sinks post in %s mode.\n\n", httpMode)
	fmt.Fprintln(w, "| sinks | Record, filling the outbox (events/s) | sink | drained in | published (events/s) | / Record | duplicates |")
	fmt.Fprintln(w, "| --- | ---: | --- | ---: | ---: | ---: | ---: |")
	for _, d := range r.Drains {
		for _, k := range d.Sinks {
			rate := float64(s.Backlog) / d.Drain[k].Seconds()
			fmt.Fprintf(w, "| %s | %.0f | %s | %.2fs | %.0f | %.0f%% | %d |\n", sinkList(d.Sinks), d.RecordPerSecond, kindNames[k],
				d.Drain[k].Seconds(), rate, 100*rate/d.RecordPerSecond, d.Duplicates[k])
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Drained in: from the service's relay taking the leadership the bench held while the backlog")
	fmt.Fprintln(w, "was recorded, to the consumer holding every event.")

	m := r.Max
	fmt.Fprintf(w, "\n### Record's maximum rate: %s of %d clients flat out per setup, batches of %d, median of %d rounds (each runs both setups, rotating the first)\n\n", o.EgressSize.MaxFor, o.Clients, s.Batch, o.Rounds)
	fmt.Fprintln(w, "| setup | Record (events/s) | / no sink (median of rounds) | each round | CPU per event: this process | CPU per event: Postgres | / no sink, by CPU |")
	fmt.Fprintln(w, "| --- | ---: | ---: | --- | ---: | ---: | ---: |")
	for i, name := range m.Setups {
		fmt.Fprintf(w, "| %s | %.0f | %.0f%% | %s | %s |\n", name, m.median(m.PerSecond, i), 100*m.median(m.Ratios, i), percents(m.Ratios[i]), cpuColumns(o, m, i))
	}
	if len(m.Runs) == o.Rounds {
		kinds := s.lagSinks()
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Each round: Record's rate in both setups, its latency with the sinks, and the share of the recorded events each consumer held when the load stopped:")
		fmt.Fprintln(w)
		fmt.Fprintf(w, "| round | no sink (events/s) | %s (events/s) | ratio | Record p50 | Record p99 |", sinkList(kinds))
		for _, k := range kinds {
			fmt.Fprintf(w, " %s |", kindNames[k])
		}
		fmt.Fprintln(w)
		fmt.Fprint(w, "| ---: | ---: | ---: | ---: | ---: | ---: |")
		for range kinds {
			fmt.Fprint(w, " ---: |")
		}
		fmt.Fprintln(w)
		for i, run := range m.Runs {
			fmt.Fprintf(w, "| %d | %.0f | %.0f | %.0f%% | %s | %s |", i+1, m.PerSecond[0][i], m.PerSecond[1][i], 100*m.Ratios[1][i], ms(run.P50), ms(run.P99))
			for _, k := range kinds {
				fmt.Fprintf(w, " %.0f%% |", 100*run.Delivered[k])
			}
			fmt.Fprintln(w)
		}
	}

	p := r.Paced
	what := "half the maximum rate"
	if s.PacedRate > 0 {
		what = "a set rate"
	}
	fmt.Fprintf(w, "\n### Lag at %s: %.0f events/s asked (%.0f reached) for %s, %d clients on a ticker each, batches of %d; Record p50 %s, p99 %s\n\n",
		what, p.Target, p.PerSecond, p.Duration.Round(100*time.Millisecond), o.Clients, s.Batch, ms(p.RecordP50), ms(p.RecordP99))
	fmt.Fprintln(w, "| sink | events | lag p50 | lag p99 | lag max | p99 from sending | duplicates | not delivered |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, l := range p.Lags {
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %d | %d |\n", kindNames[l.Sink], l.Events, ms(l.P50), ms(l.P99), ms(l.Max), ms(l.P99Sent), l.Duplicates, l.Missing)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Lag: from the return of the Record that carried the event to the event's arrival at the consumer.")
	if !p.Drained {
		fmt.Fprintf(w, "Not every event arrived within %s.\n", s.DrainTimeout)
	}

	sl := r.Slow
	fmt.Fprintf(w, "\n### A slow sink and Record: %d events per setup, %d clients, batches of %d, median of %d rounds (each runs every setup, rotating the first)\n\n", s.SlowEvents, o.Clients, s.Batch, o.Rounds)
	fmt.Fprintln(w, "| setup | Record (events/s) | / no sink (median of rounds) | each round | CPU per event: this process | CPU per event: Postgres | / no sink, by CPU |")
	fmt.Fprintln(w, "| --- | ---: | ---: | --- | ---: | ---: | ---: |")
	for i, name := range sl.Setups {
		fmt.Fprintf(w, "| %s | %.0f | %.0f%% | %s | %s |\n", name, sl.median(sl.PerSecond, i), 100*sl.median(sl.Ratios, i), percents(sl.Ratios[i]), cpuColumns(o, sl, i))
	}
}

// cpuColumns are a setup's CPU per event and its ratio to the first setup's.
func cpuColumns(o Options, r Rounds, i int) string {
	cpu, base := r.cpu(i), r.cpu(0)
	pg, byCPU := "-", "-"
	if o.Postgres != nil {
		pg = fmt.Sprintf("%.1fµs", micros(cpu[postgresGroup]))
		byCPU = fmt.Sprintf("%.0f%%", 100*float64(base.Total())/float64(cpu.Total()))
	}
	return fmt.Sprintf("%.1fµs | %s | %s", micros(cpu[benchutil.SelfGroup]), pg, byCPU)
}
