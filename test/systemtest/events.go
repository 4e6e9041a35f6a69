package systemtest

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
)

// EventsReader is what the system tests' checks read from the events service.
type EventsReader interface {
	ListActions(context.Context, *connect.Request[eventsv1.ListActionsRequest]) (*connect.Response[eventsv1.ListActionsResponse], error)
	ListActionEvents(context.Context, *connect.Request[eventsv1.ListActionEventsRequest]) (*connect.Response[eventsv1.ListActionEventsResponse], error)
}

// maxPages bounds a paged read, so that a service that never ends its pages fails the
// check instead of hanging it.
const maxPages = 1000

// ListActionEvents reads every event of an action, page by page, each call bounded by
// 10 s.
func ListActionEvents(ctx context.Context, c EventsReader, id *flytecorev1.ActionIdentifier) ([]*eventsv1.ActionEvent, error) {
	var out []*eventsv1.ActionEvent
	token := ""
	for range maxPages {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := c.ListActionEvents(cctx, connect.NewRequest(&eventsv1.ListActionEventsRequest{Id: id, PageSize: 1000, PageToken: token}))
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Msg.GetEvents()...)
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
	return nil, fmt.Errorf("more than %d pages of events", maxPages)
}

// ListActions reads every action of a project and domain, page by page, each call
// bounded by 10 s. On an error it returns what it read before it.
func ListActions(ctx context.Context, c EventsReader, project, domain string) ([]*eventsv1.Action, error) {
	var out []*eventsv1.Action
	token := ""
	for range maxPages {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := c.ListActions(cctx, connect.NewRequest(&eventsv1.ListActionsRequest{Project: project, Domain: domain, PageSize: 1000, PageToken: token}))
		cancel()
		if err != nil {
			return out, err
		}
		out = append(out, resp.Msg.GetActions()...)
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
	return out, fmt.Errorf("more than %d pages of actions", maxPages)
}
