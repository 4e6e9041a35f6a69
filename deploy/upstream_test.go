package deploy_test

// The images compose runs that this repository does not build: what the test knows of
// them without Docker (their ports, and what their commands mean), and the stand-ins
// runCompose runs in their place.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/jackc/pgx/v5/pgxpool"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/outbox"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/internal/rpcclient"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/natstest"
)

// upstreamImage is what the test knows of an image it does not build.
type upstreamImage struct {
	// listens are the ports it listens on, by what a URL to that port must be for.
	listens map[int]string
	// command, when set, reads the service's command as the image's program does. An
	// image without it must be given no command.
	command func(info *composeInfo) (upstreamCommand, error)
}

// upstreamCommand is what a service's command says its upstream program does.
type upstreamCommand struct {
	listens map[int]string // replacing the image's
	urls    []urlUse
	// standIn is what the stand-in needs to know: the NATS server's options, the
	// stream the nats CLI adds.
	standIn any
}

// upstreamImages are the images this repository does not build, by repository.
var upstreamImages = map[string]upstreamImage{
	"postgres":                 {listens: map[int]string{5432: "postgres"}},
	"jaegertracing/all-in-one": {listens: map[int]string{16686: "ui", 4317: "otlp-grpc", 4318: "otlp-http", 14269: "admin"}},
	"nats":                     {command: natsServerCommand},
	"natsio/nats-box":          {listens: map[int]string{}, command: natsCLICommand},
}

// natsListener names NATS's client port: nats:// URLs must reach it.
const natsListener = "nats"

// natsServerOptions parses the nats image's command with nats-server's own flags (the
// module the events service's tests and make run use).
func natsServerOptions(command []string) (*natsserver.Options, error) {
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	noop := func() {}
	opts, err := natsserver.ConfigureOptions(fs, command, noop, noop, noop)
	if err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("arguments %q: nats-server takes none but flags", fs.Args())
	}
	return opts, nil
}

// natsServerCommand: the server must run JetStream (the sink publishes to a stream),
// store it in a volume, and listen on the ports the command gives.
func natsServerCommand(info *composeInfo) (upstreamCommand, error) {
	opts, err := natsServerOptions(info.svc.Command)
	if err != nil {
		return upstreamCommand{}, err
	}
	switch {
	case !opts.JetStream:
		return upstreamCommand{}, errors.New("JetStream is off (--jetstream): the events service's NATS sink publishes to a stream")
	case opts.StoreDir == "":
		return upstreamCommand{}, errors.New("no --store_dir: JetStream would store in the container, and lose the stream with it")
	case opts.Host != "" && opts.Host != "0.0.0.0":
		return upstreamCommand{}, fmt.Errorf("--addr %s: other containers could not reach it", opts.Host)
	}
	if m, ok := info.mounts[opts.StoreDir]; !ok || m.Type != types.VolumeTypeVolume {
		return upstreamCommand{}, fmt.Errorf("--store_dir %s is no volume's mount point: the stream would not outlive the container", opts.StoreDir)
	}
	listens := map[int]string{cmp.Or(opts.Port, natsserver.DEFAULT_PORT): natsListener}
	if opts.HTTPPort > 0 {
		listens[opts.HTTPPort] = "monitoring"
	}
	return upstreamCommand{listens: listens}, nil
}

// natsStreamAdd is `nats stream add` as the nats CLI (in natsio/nats-box) runs it.
type natsStreamAdd struct {
	server string
	cfg    jetstream.StreamConfig
}

// natsCLICommand reads `nats --server=URL stream add NAME --flag=value...` for the
// flags compose uses, and makes the stream configuration the CLI sends with --defaults
// (natscli's stream add: limits retention, discard old, no limits, one replica, direct
// gets allowed). Another flag fails: teach it here first.
func natsCLICommand(info *composeInfo) (upstreamCommand, error) {
	args := info.svc.Command
	if len(args) == 0 || args[0] != "nats" {
		return upstreamCommand{}, errors.New("want the nats CLI: [nats, --server=URL, stream, add, NAME, FLAGS...]")
	}
	add := &natsStreamAdd{cfg: jetstream.StreamConfig{
		Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld, Storage: jetstream.FileStorage, Replicas: 1,
		MaxConsumers: -1, MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxMsgSize: -1, AllowDirect: true,
	}}
	var positional []string
	defaults := false
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			positional = append(positional, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "defaults" && !hasValue {
			if i++; i == len(args) {
				return upstreamCommand{}, fmt.Errorf("%s wants a value", a)
			}
			value = args[i]
		}
		switch name {
		case "s", "server":
			add.server = value
		case "subjects":
			add.cfg.Subjects = append(add.cfg.Subjects, strings.Split(value, ",")...)
		case "storage":
			switch value {
			case "file", "f":
				add.cfg.Storage = jetstream.FileStorage
			case "memory", "m":
				add.cfg.Storage = jetstream.MemoryStorage
			default:
				return upstreamCommand{}, fmt.Errorf("--storage %q: file or memory", value)
			}
		case "dupe-window":
			d, err := time.ParseDuration(value)
			if err != nil {
				return upstreamCommand{}, fmt.Errorf("--dupe-window: %w", err)
			}
			add.cfg.Duplicates = d
		case "defaults":
			defaults = true
		default:
			return upstreamCommand{}, fmt.Errorf("flag %s: teach this test what the nats CLI does with it (natsCLICommand)", a)
		}
	}
	switch {
	case len(positional) != 3 || positional[0] != "stream" || positional[1] != "add":
		return upstreamCommand{}, fmt.Errorf("arguments %q: want stream add NAME", positional)
	case !defaults:
		return upstreamCommand{}, errors.New("no --defaults: the CLI would ask for what is not given, and compose gives it no terminal")
	case len(add.cfg.Subjects) == 0:
		return upstreamCommand{}, errors.New("no --subjects")
	case add.server == "":
		return upstreamCommand{}, errors.New("no --server: the CLI would call nats://127.0.0.1:4222, its own container")
	}
	add.cfg.Name = positional[2]
	return upstreamCommand{listens: map[int]string{}, urls: []urlUse{{where: "command --server", raw: add.server, want: natsListener}}, standIn: add}, nil
}

// natsSink is a sink of the events service's to a NATS server: its name, where it is
// configured, the server (nats://host:port), and to which stream and subject.
type natsSink struct {
	name, where, url, host, stream, subject string
}

// natsSinks lists a service's NATS sinks, one per server: its --cloudevents-config's
// and its --cloudevents-sink's.
func natsSinks(info *composeInfo) []natsSink {
	var out []natsSink
	for i, s := range info.sinks {
		if s.NATS == nil {
			continue
		}
		c, err := s.Config()
		if err != nil {
			continue // reported with the file
		}
		for _, server := range s.NATS.Servers {
			host, _, err := net.SplitHostPort(server)
			if err != nil {
				host = server
			}
			out = append(out, natsSink{name: c.Name(), where: fmt.Sprintf("--cloudevents-config sinks[%d]", i), url: "nats://" + server,
				host: host, stream: s.NATS.Stream, subject: cmp.Or(s.NATS.Subject, cloudevents.DefaultNATSSubject)})
		}
	}
	for _, raw := range info.given["cloudevents-sink"] {
		c, err := cloudevents.Parse(raw)
		if err != nil || c.Kind() != cloudevents.KindNATS {
			continue
		}
		u, _ := url.Parse(c.Target()) // nats://host:port,host:port/subject
		for _, server := range strings.Split(u.Host, ",") {
			host, _, _ := net.SplitHostPort(server)
			out = append(out, natsSink{name: c.Name(), where: "--cloudevents-sink " + raw, url: "nats://" + server, host: host, subject: strings.TrimPrefix(u.Path, "/")})
		}
	}
	return out
}

// checkNATSStreams requires every NATS sink's subject to be stored by a stream that a
// one-shot service the sink's service waits for creates on that server: the sink
// never creates one, and without one it retries forever.
func checkNATSStreams(t interface{ Errorf(string, ...any) }, infos map[string]*composeInfo) {
	for _, name := range slices.Sorted(maps.Keys(infos)) {
		info := infos[name]
		for _, sink := range natsSinks(info) {
			found := false
			for _, creator := range slices.Sorted(maps.Keys(infos)) {
				add, ok := infos[creator].standIn.(*natsStreamAdd)
				if !ok {
					continue
				}
				u, err := url.Parse(add.server)
				if err != nil || u.Hostname() != sink.host || (sink.stream != "" && sink.stream != add.cfg.Name) ||
					!slices.ContainsFunc(add.cfg.Subjects, func(s string) bool { return subjectMatches(s, sink.subject) }) {
					continue
				}
				found = true
				if d, ok := info.svc.DependsOn[creator]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
					t.Errorf("service %s %s: does not wait for %s, which creates its stream, to complete", name, sink.where, creator)
				}
			}
			if !found {
				t.Errorf("service %s %s: no service creates a stream %q storing subject %s on %s (the sink never creates one)", name, sink.where, sink.stream, sink.subject, sink.host)
			}
		}
	}
}

// subjectMatches reports whether a stream's subject (with NATS wildcards * and >)
// stores subject.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}

// standInNATS runs nats-server in process with the options of the service's command,
// on 127.0.0.1 and free ports, storing in its volume's directory; then its health check
// as compose runs it. It returns the addresses by container port.
func (r *composeRun) standInNATS(info *composeInfo) map[int]string {
	t := r.t
	opts, err := natsServerOptions(info.svc.Command)
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[int]string{}
	bind := func(containerPort int) int {
		addr := freeAddr(t)
		addrs[containerPort] = addr
		_, p, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(p)
		return n
	}
	opts.Host, opts.Port = "127.0.0.1", bind(cmp.Or(opts.Port, natsserver.DEFAULT_PORT))
	if opts.HTTPPort > 0 {
		opts.HTTPHost, opts.HTTPPort = "127.0.0.1", bind(opts.HTTPPort)
	}
	if opts.StoreDir, err = info.hostPath(opts.StoreDir); err != nil {
		t.Fatal(err)
	}
	natstest.Run(t, opts)
	r.waitUpstreamHealthy(info, addrs)
	return addrs
}

// waitUpstreamHealthy runs an upstream image's health check on its stand-in, as compose
// does: a wget of a URL in its own container is a GET of that port here.
func (r *composeRun) waitUpstreamHealthy(info *composeInfo, addrs map[int]string) {
	t, hc := r.t, info.svc.HealthCheck
	if hc == nil {
		return
	}
	if len(hc.Test) < 3 || hc.Test[0] != "CMD" || hc.Test[1] != "wget" {
		t.Fatalf("service %s: health check %q: teach this test to run it on the stand-in", info.name, hc.Test)
	}
	target, err := url.Parse(hc.Test[len(hc.Test)-1])
	if err != nil || target.Scheme != "http" || (target.Hostname() != "127.0.0.1" && target.Hostname() != "localhost") {
		t.Fatalf("service %s: health check %q: want a wget of http://127.0.0.1:PORT/PATH last", info.name, hc.Test)
	}
	p, _ := strconv.Atoi(cmp.Or(target.Port(), "80"))
	if addrs[p] == "" {
		t.Fatalf("service %s: health check %s: nothing listens on %d", info.name, target, p)
	}
	target.Host = addrs[p]
	client := &http.Client{Timeout: time.Duration(*hc.Timeout)}
	for range *hc.Retries {
		resp, err := client.Get(target.String())
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK { // busybox wget fails on anything else
				return
			}
		}
		time.Sleep(time.Duration(*hc.Interval))
	}
	t.Fatalf("service %s: health check %q never passed on its stand-in", info.name, hc.Test)
}

// runUpstreamOneShot does what a one-shot upstream service would, on the stand-ins:
// the nats CLI's stream, created twice, since compose runs it on every up and the
// second must keep the first.
func (r *composeRun) runUpstreamOneShot(info *composeInfo) {
	t := r.t
	add, ok := info.standIn.(*natsStreamAdd)
	if !ok {
		t.Fatalf("service %s: no stand-in for the one-shot %s", info.name, info.svc.Image)
	}
	addr, err := r.remap(add.server)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(addr)
	if err != nil {
		t.Fatalf("service %s: %v", info.name, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for i := range 2 {
		if _, err := js.CreateStream(ctx, add.cfg); err != nil {
			t.Fatalf("service %s (run %d): creating stream %s: %v", info.name, i+1, add.cfg.Name, err)
		}
	}
	t.Logf("service %s: stream %s (subjects %v) on %s", info.name, add.cfg.Name, add.cfg.Subjects, addr)
}

// checkCloudEvents follows one event through a service's NATS sinks: once the relay
// leads and has registered them (an event recorded before is not queued for a new
// sink), an event recorded with the executors' token must arrive on each sink's stream
// as the CloudEvent the service makes of it, identified for the duplicate window.
func (r *composeRun) checkCloudEvents(info *composeInfo, addr, caFile string) {
	sinks := natsSinks(info)
	if len(sinks) == 0 {
		return
	}
	t, where := r.t, "service "+info.name
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	pool, err := pgxpool.New(ctx, r.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ob := outbox.New(pool)
	for _, sink := range sinks {
		for {
			_, _, err := ob.Lag(ctx, sink.name)
			if err == nil {
				break
			}
			if !errors.Is(err, outbox.ErrUnknownSink) || ctx.Err() != nil {
				t.Fatalf("%s: its relay did not register sink %s: %v", where, sink.name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	tokens, err := tokensByGroup(info, info.args["auth-token-file"])
	if err != nil {
		t.Fatal(err)
	}
	client, err := rpcclient.New(rpcclient.Options{CAFile: caFile, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bearer := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+tokens[auth.Executors])
			return next(ctx, req)
		}
	})
	ev := &eventsv1.ActionEvent{
		Id:      &flytecorev1.ActionIdentifier{Project: "compose", Domain: "development", Run: "egress", Action: "egress"},
		Attempt: 1, Phase: flytecorev1.ActionPhase_ACTION_PHASE_QUEUED, OccurredAt: timestamppb.Now(),
	}
	events := eventsv1connect.NewEventsServiceClient(client, "https://"+addr, connect.WithInterceptors(bearer))
	if _, err := events.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{ev}})); err != nil {
		t.Fatalf("%s: Record: %v", where, err)
	}
	want, err := cloudevents.Convert(ev, info.args["cloudevents-cluster"])
	if err != nil {
		t.Fatal(err)
	}

	for _, sink := range sinks {
		here, err := r.remap(sink.url)
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(here)
		nc, err := nats.Connect("nats://" + u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		stream := sink.stream
		if stream == "" {
			if stream, err = js.StreamNameBySubject(ctx, sink.subject); err != nil {
				t.Fatalf("%s %s: no stream stores %s: %v", where, sink.where, sink.subject, err)
			}
		}
		cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{sink.subject}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for found := false; !found; {
			if ctx.Err() != nil {
				t.Fatalf("%s %s: CloudEvent %s never arrived on stream %s (got %q)", where, sink.where, want.ID(), stream, got)
			}
			batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				var e event.Event
				if err := json.Unmarshal(m.Data(), &e); err != nil {
					t.Errorf("%s: a message on %s is no CloudEvent: %v", where, stream, err)
					continue
				}
				got = append(got, e.ID())
				if e.ID() != want.ID() {
					continue
				}
				found = true
				if e.Source() != want.Source() || e.Type() != want.Type() || m.Headers().Get(jetstream.MsgIDHeader) != cloudevents.MsgID(&want) {
					t.Errorf("%s: CloudEvent %s arrived as source %s, type %s, Nats-Msg-Id %q; want %s, %s, %q", where, e.ID(), e.Source(), e.Type(),
						m.Headers().Get(jetstream.MsgIDHeader), want.Source(), want.Type(), cloudevents.MsgID(&want))
				}
			}
		}
		t.Logf("%s: CloudEvent %s arrived on stream %s through %s (%s)", where, want.ID(), stream, sink.url, sink.where)
	}
}
