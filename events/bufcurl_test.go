package events_test

import (
	"strings"
	"testing"
	"time"

	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/test/eventually"
	"github.com/flytekube/backend/test/servicetest"
)

// TestBufCurlCallsEveryRPC runs the buf curl commands of docs/events.md against a
// running service: reflection alone must be enough to call every RPC.
func TestBufCurlCallsEveryRPC(t *testing.T) {
	// As the cookbook shows it: TLS, and an executor's token (a viewer could not write).
	pki, tokens := servicetest.NewPKI(t), servicetest.NewTokens(t)
	inst := startInstance(t, pg.NewDatabase(t), func(c *events.Config) { c.Server, c.Auth = pki.ServerConfig(), tokens.AuthConfig() })
	inst.UseTLS(pki, tokens.Executor)
	base := inst.URL + "/flyte.events.v1.EventsService/"
	const id = `{"project":"demo","domain":"development","run":"r1","action":"a0"}`

	if out := inst.BufCurl(t, "--list-methods", inst.URL); !strings.Contains(out, "flyte.events.v1.EventsService/WatchActions") {
		t.Fatalf("--list-methods:\n%s", out)
	}

	// Open a watch first and wait until the server counts it.
	var watchOut servicetest.SyncBuffer
	watch := inst.BufCurlCommand(t, t.Context(), "-d", `{"project":"demo","domain":"development","run":"r1"}`, base+"WatchActions")
	watch.Stdout, watch.Stderr = &watchOut, &watchOut
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Process.Kill() }()
	if !inst.WaitForMetric(t, "flyte_events_watchers 1") {
		t.Fatalf("the watch never opened; buf curl printed:\n%s", watchOut.String())
	}

	out := inst.BufCurl(t, "-d", `{"events":[{"id":`+id+`,"attempt":1,"phase":"ACTION_PHASE_RUNNING","occurredAt":"2026-11-29T10:00:00Z","taskType":"container"}]}`, base+"Record")
	if !strings.Contains(out, `"recorded": 1`) {
		t.Fatalf("Record:\n%s", out)
	}
	for rpc, body := range map[string]string{
		"GetAction":        `{"id":` + id + `}`,
		"ListActions":      `{"project":"demo","domain":"development","pageSize":10}`,
		"ListActionEvents": `{"id":` + id + `}`,
	} {
		if out := inst.BufCurl(t, "-d", body, base+rpc); !strings.Contains(out, "ACTION_PHASE_RUNNING") {
			t.Fatalf("%s:\n%s", rpc, out)
		}
	}

	eventually.True(t, 20*time.Second, func() bool { return strings.Contains(watchOut.String(), "ACTION_PHASE_RUNNING") },
		func() string { return "WatchActions printed:\n" + watchOut.String() })
}
