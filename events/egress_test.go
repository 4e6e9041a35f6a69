package events_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/events/cloudevents"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/eventually"
)

// The service relays what Record stores to its sinks; what a sink refuses for good is
// listed by EgressService, and replayed on request once the sink takes it.
func TestEgressOverTheService(t *testing.T) {
	var refusing atomic.Bool
	refusing.Store(true)
	var accepted atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refusing.Load() {
			http.Error(w, "no such schema", http.StatusUnprocessableEntity)
			return
		}
		accepted.Add(1)
	}))
	t.Cleanup(receiver.Close)
	// The sink comes from the configuration file, as --cloudevents-config names it.
	sinks := filepath.Join(t.TempDir(), "sinks.yaml")
	if err := os.WriteFile(sinks, []byte("sinks:\n  - name: receiver\n    http: {url: '"+receiver.URL+"'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Recorded as soon as the service answers, before its relay leads: the service
	// registered its sinks before serving, so nothing it acknowledges goes unqueued.
	dbURL := pg.NewDatabase(t)
	inst := startInstance(t, dbURL, func(c *events.Config) {
		c.CloudEventsConfig = sinks
		c.CloudEvents.Poll = 20 * time.Millisecond
		c.CloudEvents.LeaderCheck = time.Second
	})
	egress := eventsv1connect.NewEgressServiceClient(inst.HTTP, inst.URL, connect.WithGRPC())
	ctx := context.Background()
	listSinks := func() *eventsv1.Sink {
		t.Helper()
		resp, err := egress.ListSinks(ctx, connect.NewRequest(&eventsv1.ListSinksRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.GetSinks()) != 1 {
			t.Fatalf("sinks: %v", resp.Msg.GetSinks())
		}
		return resp.Msg.GetSinks()[0]
	}
	if target := listSinks().GetTarget(); target != receiver.URL {
		t.Errorf("the sink's target: %q", target)
	}
	record(t, inst.client, event(actionID("egress", "a"), 1, queued, 0, 0), event(actionID("egress", "a"), 1, running, 1, 1))
	eventually.True(t, 20*time.Second, func() bool { return listSinks().GetDeadLetters() == 2 },
		func() string { return "the refused events are not counted as dead letters" })
	listed, err := egress.ListDeadLetters(ctx, connect.NewRequest(&eventsv1.ListDeadLettersRequest{Sink: "receiver", PageSize: 1}))
	if err != nil {
		t.Fatal(err)
	}
	letters := listed.Msg.GetDeadLetters()
	if len(letters) != 1 || listed.Msg.GetNextPageToken() == "" || letters[0].GetEvent().GetPhase() != queued ||
		!strings.HasPrefix(letters[0].GetDetail(), "HTTP 422") || letters[0].GetReplayRequested() {
		t.Fatalf("first page of dead letters: %v (next %q)", letters, listed.Msg.GetNextPageToken())
	}
	next, err := egress.ListDeadLetters(ctx, connect.NewRequest(&eventsv1.ListDeadLettersRequest{Sink: "receiver", PageToken: listed.Msg.GetNextPageToken()}))
	if err != nil || len(next.Msg.GetDeadLetters()) != 1 || next.Msg.GetDeadLetters()[0].GetEvent().GetPhase() != running {
		t.Fatalf("second page: %v, %v", next.Msg.GetDeadLetters(), err)
	}

	// Ids and all together are refused by the contract's rule.
	_, err = egress.ReplayDeadLetters(ctx, connect.NewRequest(&eventsv1.ReplayDeadLettersRequest{Sink: "receiver", Ids: []int64{letters[0].GetId()}, All: true}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("ids and all: %v", err)
	}
	refusing.Store(false)
	replay, err := egress.ReplayDeadLetters(ctx, connect.NewRequest(&eventsv1.ReplayDeadLettersRequest{Sink: "receiver", Ids: []int64{letters[0].GetId()}}))
	if err != nil || replay.Msg.GetRequested() != 1 {
		t.Fatalf("replaying one: %v, %v", replay, err)
	}
	eventually.True(t, 20*time.Second, func() bool { return accepted.Load() == 1 && listSinks().GetDeadLetters() == 1 },
		func() string { return "the replayed dead letter was not delivered, or not removed" })
	if _, err := egress.ReplayDeadLetters(ctx, connect.NewRequest(&eventsv1.ReplayDeadLettersRequest{Sink: "receiver", All: true})); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 20*time.Second, func() bool { return accepted.Load() == 2 && listSinks().GetDeadLetters() == 0 },
		func() string { return "replaying all left some" })
}

// TestRunRefusesABadSinksFile: a sinks' file that is not valid, or whose sinks' names
// clash with a --cloudevents-sink's, stops the service at start, saying which file,
// sink and field; before it touches the database.
func TestRunRefusesABadSinksFile(t *testing.T) {
	dir := t.TempDir()
	bad, good := filepath.Join(dir, "bad.yaml"), filepath.Join(dir, "good.yaml")
	for file, content := range map[string]string{
		bad:  "sinks:\n  - name: alerts\n    http: {url: 'https://hooks.example.com/x', batchsize: 10}\n",
		good: "sinks:\n  - name: alerts\n    http: {url: 'https://hooks.example.com/x'}\n",
	} {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	flagged, err := cloudevents.Parse("http://127.0.0.1:1/x?name=alerts")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file  string
		flags []cloudevents.Config
		want  string
	}{
		{bad, nil, "cloudevents-config: " + bad + `: sinks[0] "alerts": unknown field "http.batchsize"`},
		{filepath.Join(dir, "missing.yaml"), nil, "missing.yaml"},
		{good, []cloudevents.Config{flagged}, `two sinks are named "alerts"`},
	} {
		cfg := events.Config{DatabaseURL: "postgres://127.0.0.1:1/none", Auth: auth.Config{Mode: auth.ModeNone}, CloudEventsConfig: tc.file}
		cfg.CloudEvents.Sinks = tc.flags
		err := events.Run(context.Background(), cfg, slog.New(slog.DiscardHandler), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.file, err, tc.want)
		}
	}
}

// TestEgressShowsNoSinkSecrets: an HTTP sink configured without name= whose URL carries
// secrets in its path and query, and whose receiver echoes the refused request with its
// bearer token, shows none of them in what the service tells: the sink's name and
// target (ListSinks), its dead letters' sink and detail (ListDeadLetters), the
// metrics' labels. The detail of a dead letter kept before details were redacted, under
// the name the sink had then (its URL's path included), is redacted as it is listed.
func TestEgressShowsNoSinkSecrets(t *testing.T) {
	const (
		token       = "tok-Zq8vN3xL0pR7"
		pathSecret  = "XXXXsecretXXXXpath"
		querySecret = "s1gQu3rySecret"
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, "%s %s\nAuthorization: %s\n", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"))
	}))
	t.Cleanup(receiver.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	hook := receiver.URL + "/services/T000/B000/" + pathSecret
	sink, err := cloudevents.SinkSpec{HTTP: &cloudevents.HTTPSpec{URL: hook + "?sig=" + querySecret, TokenFile: tokenFile}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	dbURL := pg.NewDatabase(t)
	inst := startInstance(t, dbURL, func(c *events.Config) {
		c.CloudEvents.Sinks = append(c.CloudEvents.Sinks, sink)
		c.CloudEvents.Poll = 20 * time.Millisecond
		c.CloudEvents.LeaderCheck = time.Second
	})
	egress := eventsv1connect.NewEgressServiceClient(inst.HTTP, inst.URL, connect.WithGRPC())
	ctx := context.Background()
	secrets := []string{token, pathSecret, querySecret}
	requireHidden := func(what, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s %q shows the secret %q", what, text, s)
			}
		}
	}

	record(t, inst.client, event(actionID("secrets", "a"), 1, queued, 0, 0))
	var listed *eventsv1.Sink
	eventually.True(t, 20*time.Second, func() bool {
		resp, err := egress.ListSinks(ctx, connect.NewRequest(&eventsv1.ListSinksRequest{}))
		if err != nil || len(resp.Msg.GetSinks()) != 1 {
			return false
		}
		listed = resp.Msg.GetSinks()[0]
		return listed.GetDeadLetters() == 1
	}, func() string { return fmt.Sprintf("the refused event is not a dead letter: %v", listed) })
	requireHidden("the sink's name", listed.GetName())
	requireHidden("the sink's target", listed.GetTarget())

	letters := listDeadLetters(t, egress, listed.GetName())
	if len(letters) != 1 || !strings.HasPrefix(letters[0].GetDetail(), "HTTP 422: POST ") {
		t.Fatalf("dead letters of %q: %v", listed.GetName(), letters)
	}
	requireHidden("the dead letter's detail", letters[0].GetDetail())

	resp, err := http.Get(inst.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || !strings.Contains(string(metrics), `sink="`+listed.GetName()+`"`) {
		t.Fatalf("/metrics has no series of the sink %q (%v)", listed.GetName(), err)
	}
	for _, line := range strings.Split(string(metrics), "\n") {
		requireHidden("the /metrics line", line)
	}

	// As kept before: under the sink's old name, with the receiver's answer verbatim.
	_, pool := openStore(t, dbURL)
	verbatim := "POST /services/T000/B000/" + pathSecret + "?sig=" + querySecret + "\nAuthorization: Bearer " + token
	if _, err := pool.Exec(ctx, `UPDATE cloudevent_dead_letters SET sink = $1, detail = $2`, hook, "HTTP 422: "+verbatim); err != nil {
		t.Fatal(err)
	}
	letters = listDeadLetters(t, egress, "")
	if len(letters) != 1 {
		t.Fatalf("dead letters: %v", letters)
	}
	requireHidden("an old dead letter's detail", letters[0].GetDetail())
}

func listDeadLetters(t *testing.T, egress eventsv1connect.EgressServiceClient, sink string) []*eventsv1.DeadLetter {
	t.Helper()
	resp, err := egress.ListDeadLetters(context.Background(), connect.NewRequest(&eventsv1.ListDeadLettersRequest{Sink: sink}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetDeadLetters()
}
