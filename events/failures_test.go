package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/events"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/app"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/test/pgtest"
	"github.com/flytekube/backend/test/servicetest"
)

// TestInternalFailuresKeepTheirDetailsInTheLog: when the store fails inside (here its
// tables are gone), callers over gRPC and Connect get Internal with a message that says
// nothing of the database, only a reference under which the service logged what
// happened, with the procedure and the database's own words.
func TestInternalFailuresKeepTheirDetailsInTheLog(t *testing.T) {
	db := pg.NewDatabase(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	var logs servicetest.SyncBuffer
	cfg := events.Config{Listen: "127.0.0.1:0", DatabaseURL: db, Auth: auth.Config{Mode: auth.ModeNone}}
	inst := servicetest.Start(t, func(ctx context.Context, started func(app.Addrs)) error {
		return events.Run(ctx, cfg, slog.New(slog.NewJSONHandler(&logs, nil)), started)
	})
	ctx := context.Background()
	e := event(actionID("r1", "a0"), 1, running, 0, 1)
	grpcClient := eventsv1connect.NewEventsServiceClient(inst.HTTP, inst.URL, connect.WithGRPC())
	record(t, grpcClient, e)

	pgtest.Exec(t, db, "ALTER TABLE actions RENAME TO actions_gone; ALTER TABLE action_events RENAME TO action_events_gone")

	// What the database would say, and where it is and who the service is to it (over a
	// socket, the host is a directory).
	secrets := []string{"SQLSTATE", "42P01", "relation", `"actions"`, `"action_events"`, "does not exist",
		u.User.Username(), strings.TrimPrefix(u.Path, "/")}
	for _, where := range []string{u.Hostname(), u.Query().Get("host")} {
		if where != "" {
			secrets = append(secrets, where)
		}
	}
	reference := regexp.MustCompile(`under ref ([0-9a-f]{32})$`)
	calls := map[string]func(eventsv1connect.EventsServiceClient) error{
		eventsv1connect.EventsServiceRecordProcedure: func(c eventsv1connect.EventsServiceClient) error {
			_, err := c.Record(ctx, connect.NewRequest(&eventsv1.RecordRequest{Events: []*eventsv1.ActionEvent{e}}))
			return err
		},
		eventsv1connect.EventsServiceGetActionProcedure: func(c eventsv1connect.EventsServiceClient) error {
			_, err := c.GetAction(ctx, connect.NewRequest(&eventsv1.GetActionRequest{Id: e.GetId()}))
			return err
		},
		eventsv1connect.EventsServiceListActionsProcedure: func(c eventsv1connect.EventsServiceClient) error {
			_, err := c.ListActions(ctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development"}))
			return err
		},
		eventsv1connect.EventsServiceListActionEventsProcedure: func(c eventsv1connect.EventsServiceClient) error {
			_, err := c.ListActionEvents(ctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: e.GetId()}))
			return err
		},
	}
	clients := map[string]eventsv1connect.EventsServiceClient{
		"gRPC":    grpcClient,
		"Connect": eventsv1connect.NewEventsServiceClient(inst.HTTP, inst.URL),
	}
	for protocol, client := range clients {
		for procedure, call := range calls {
			t.Run(protocol+" "+procedure, func(t *testing.T) {
				err := call(client)
				if connect.CodeOf(err) != connect.CodeInternal {
					t.Fatalf("got %v; want Internal", err)
				}
				var answer *connect.Error
				if !errors.As(err, &answer) {
					t.Fatalf("%v is not an RPC answer", err)
				}
				message := answer.Message()
				for _, s := range secrets {
					if strings.Contains(message, s) {
						t.Errorf("the answer %q names %q", message, s)
					}
				}
				ref := reference.FindStringSubmatch(message)
				if ref == nil {
					t.Fatalf("the answer %q gives no reference to find its log line by", message)
				}
				line := logLine(t, logs.String(), ref[1])
				if line == nil {
					t.Fatalf("no log line has ref %s:\n%s", ref[1], logs.String())
				}
				if line["level"] != "ERROR" || line["procedure"] != procedure || !strings.Contains(fmt.Sprint(line["error"]), "does not exist") {
					t.Errorf("the log line of ref %s does not say what failed where: %v", ref[1], line)
				}
			})
		}
	}
}

// logLine returns the JSON log line whose ref is ref, or nil.
func logLine(t *testing.T, logs, ref string) map[string]any {
	t.Helper()
	for _, raw := range strings.Split(strings.TrimSpace(logs), "\n") {
		var line map[string]any
		if err := json.Unmarshal([]byte(raw), &line); err != nil {
			t.Fatalf("log line %q: %v", raw, err)
		}
		if line["ref"] == ref {
			return line
		}
	}
	return nil
}
