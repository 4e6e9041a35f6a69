package events_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

func TestGetActionNotFound(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	_, err := inst.client.GetAction(context.Background(), connect.NewRequest(&eventsv1.GetActionRequest{Id: actionID("r1", "nope")}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("got %v; want NotFound", err)
	}
}

func TestListActionsWalksEveryRowOnce(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	// 3 runs x 40 actions, recorded in batches; every third action is finished.
	var batch []*eventsv1.ActionEvent
	for i := range 120 {
		id := actionID(fmt.Sprintf("run%d", i%3), fmt.Sprintf("a%03d", i))
		phase := running
		if i%3 == 0 {
			phase = succeeded
		}
		batch = append(batch, event(id, 1, phase, 0, i))
		if len(batch) == 25 {
			record(t, inst.client, batch...)
			batch = nil
		}
	}
	record(t, inst.client, batch...)

	tests := []struct {
		name string
		req  *eventsv1.ListActionsRequest
		want int
	}{
		{"all", &eventsv1.ListActionsRequest{Project: "demo", Domain: "development", PageSize: 7}, 120},
		{"one run", &eventsv1.ListActionsRequest{Project: "demo", Domain: "development", Run: "run1", PageSize: 7}, 40},
		{"one phase", &eventsv1.ListActionsRequest{Project: "demo", Domain: "development", Phase: succeeded, PageSize: 7}, 40},
		{"run and phase", &eventsv1.ListActionsRequest{Project: "demo", Domain: "development", Run: "run0", Phase: succeeded, PageSize: 7}, 40},
		{"default page size", &eventsv1.ListActionsRequest{Project: "demo", Domain: "development"}, 120},
		{"other domain", &eventsv1.ListActionsRequest{Project: "demo", Domain: "production"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[string]bool{}
			var order []string
			req := tt.req
			for pages := 0; ; pages++ {
				if pages > 200 {
					t.Fatal("pagination does not end")
				}
				resp, err := inst.client.ListActions(context.Background(), connect.NewRequest(req))
				if err != nil {
					t.Fatal(err)
				}
				for _, a := range resp.Msg.GetActions() {
					name := a.GetId().GetAction()
					if seen[name] {
						t.Fatalf("%s listed twice", name)
					}
					seen[name] = true
					order = append(order, name)
					if req.GetRun() != "" && a.GetId().GetRun() != req.GetRun() || req.GetPhase() != 0 && a.GetPhase() != req.GetPhase() {
						t.Fatalf("%v does not match the filter", a.GetId())
					}
				}
				if resp.Msg.GetNextPageToken() == "" {
					break
				}
				if len(resp.Msg.GetActions()) == 0 {
					t.Fatal("an empty page with a next page token")
				}
				req = &eventsv1.ListActionsRequest{Project: req.GetProject(), Domain: req.GetDomain(), Run: req.GetRun(),
					Phase: req.GetPhase(), PageSize: req.GetPageSize(), PageToken: resp.Msg.GetNextPageToken()}
			}
			if len(seen) != tt.want {
				t.Fatalf("listed %d actions; want %d", len(seen), tt.want)
			}
			// Newest first: a later batch is listed before an earlier one. (Within one
			// batch the order is by key.)
			batchOf := func(name string) int {
				var i int
				_, _ = fmt.Sscanf(name, "a%03d", &i)
				return i / 25
			}
			for i := 1; i < len(order); i++ {
				if batchOf(order[i-1]) < batchOf(order[i]) {
					t.Fatalf("not newest first: %s before %s", order[i-1], order[i])
				}
			}
		})
	}
}

func TestListActionEventsInOrderAcrossPages(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	h := history("r1", "a0")
	// Deliver newest first, so storage order is the reverse of the expected order.
	for i := len(h) - 1; i >= 0; i-- {
		record(t, inst.client, h[i])
	}
	var got []string
	token := ""
	for {
		resp, err := inst.client.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{
			Id: h[0].GetId(), PageSize: 3, PageToken: token,
		}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.Msg.GetEvents() {
			got = append(got, e.GetReason())
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	var want []string
	for _, e := range h {
		want = append(want, e.GetReason())
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("events in order\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestPageTokensAreCheckedAgainstTheirQuery(t *testing.T) {
	inst := startInstance(t, pg.NewDatabase(t))
	for i := range 3 {
		record(t, inst.client, event(actionID("r1", fmt.Sprintf("a%d", i)), 1, running, 0, i))
	}
	first, err := inst.client.ListActions(context.Background(), connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", PageSize: 1}))
	if err != nil || first.Msg.GetNextPageToken() == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	token := first.Msg.GetNextPageToken()
	tests := []struct {
		name string
		call func() error
	}{
		{"garbage", func() error {
			_, err := inst.client.ListActions(context.Background(), connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", PageToken: "%%%"}))
			return err
		}},
		{"another filter", func() error {
			_, err := inst.client.ListActions(context.Background(), connect.NewRequest(&eventsv1.ListActionsRequest{Project: "demo", Domain: "development", Run: "r1", PageToken: token}))
			return err
		}},
		{"another method", func() error {
			_, err := inst.client.ListActionEvents(context.Background(), connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: actionID("r1", "a0"), PageToken: token}))
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "page_token") {
				t.Fatalf("got %v; want InvalidArgument about page_token", err)
			}
		})
	}
}
