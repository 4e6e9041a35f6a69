// Package service is the EventsService RPC edge: it turns requests into store and hub
// calls, errors into RPC codes, and keeps the service's metrics. Requests arrive already
// validated by the server's protovalidate interceptor.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/flytekube/backend/events/store"
	"github.com/flytekube/backend/events/watch"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/auth"
	"github.com/flytekube/backend/services/server"
)

// DefaultPageSize is used when a listing asks for page size 0.
const DefaultPageSize = 100

// tokenReserve is the room a page leaves in its response for everything but its items:
// the next page's token and the fields' framing.
const tokenReserve = 1 << 10

// Service implements flyte.events.v1.EventsService.
type Service struct {
	store   *store.Store
	hub     *watch.Hub
	log     *slog.Logger
	metrics *Metrics
	opts    Options
}

// Options are the service's limits.
type Options struct {
	// MaxResponseBytes bounds a listing's response; a page ends early rather than grow
	// past it, but always holds one item.
	MaxResponseBytes int
}

var _ eventsv1connect.EventsServiceHandler = (*Service)(nil)

// New creates the service. The hub must be running (watch.Hub.Run) for WatchActions to
// serve; m is shared with the hub (Metrics.Watch).
func New(st *store.Store, hub *watch.Hub, m *Metrics, log *slog.Logger, opts Options) *Service {
	return &Service{store: st, hub: hub, log: log, metrics: m, opts: opts}
}

// storeError turns a store error into the answer: a refused event is the caller's to
// fix; anything else is answered by server.DatabaseError, which keeps the database's
// words out. An Internal answer is logged where the call ends (services/server), under its
// trace; the others the caller did not cause (an outage, a conflict) are logged here.
func (s *Service) storeError(ctx context.Context, what string, err error) *connect.Error {
	var refused *store.InvalidEventError
	if errors.As(err, &refused) {
		return connect.NewError(connect.CodeInvalidArgument, refused)
	}
	var ambiguous *store.AmbiguousError
	if errors.As(err, &ambiguous) {
		return connect.NewError(connect.CodeFailedPrecondition, ambiguous)
	}
	return databaseError(ctx, s.log, what, err)
}

// databaseError answers a failed database call with server.DatabaseError, logging the
// failures the caller did not cause (an outage, a conflict) here.
func databaseError(ctx context.Context, log *slog.Logger, what string, err error) *connect.Error {
	answer := server.DatabaseError(err)
	if code := answer.Code(); code != connect.CodeCanceled && code != connect.CodeInternal {
		log.WarnContext(ctx, what, "code", code.String(), "error", err)
	}
	return answer
}

// page is the store's page for a requested size, within the response cap.
func (s *Service) page(requested uint32) store.Page {
	return store.Page{Limit: pageSize(requested), MaxBytes: max(s.opts.MaxResponseBytes-tokenReserve, 0)}
}

// Record implements EventsService.Record.
func (s *Service) Record(ctx context.Context, req *connect.Request[eventsv1.RecordRequest]) (*connect.Response[eventsv1.RecordResponse], error) {
	events := req.Msg.GetEvents()
	s.metrics.received.Add(float64(len(events)))
	s.metrics.receivedFrom(events)
	s.metrics.batchSize.Observe(float64(len(events)))
	start := time.Now()
	res, err := s.store.Record(ctx, events)
	if err != nil {
		s.metrics.record.WithLabelValues("error").Observe(time.Since(start).Seconds())
		return nil, s.storeError(ctx, "recording events", err)
	}
	s.metrics.record.WithLabelValues("ok").Observe(time.Since(start).Seconds())
	s.metrics.recorded.Add(float64(res.Recorded))
	s.metrics.duplicates.Add(float64(res.Duplicates))
	return connect.NewResponse(&eventsv1.RecordResponse{
		Recorded:   uint32(res.Recorded),
		Duplicates: uint32(res.Duplicates),
	}), nil
}

// GetAction implements EventsService.GetAction.
func (s *Service) GetAction(ctx context.Context, req *connect.Request[eventsv1.GetActionRequest]) (*connect.Response[eventsv1.GetActionResponse], error) {
	key := store.KeyOf(req.Msg.GetId())
	action, err := s.store.GetAction(ctx, key, req.Msg.Cluster)
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no events recorded for action %s", key))
	}
	if err != nil {
		return nil, s.storeError(ctx, "reading an action", err)
	}
	return connect.NewResponse(&eventsv1.GetActionResponse{Action: action}), nil
}

func pageSize(requested uint32) int {
	if requested == 0 {
		return DefaultPageSize
	}
	return int(requested)
}

// ListActions implements EventsService.ListActions.
func (s *Service) ListActions(ctx context.Context, req *connect.Request[eventsv1.ListActionsRequest]) (*connect.Response[eventsv1.ListActionsResponse], error) {
	msg := req.Msg
	// A phase this release does not name selects the actions a newer executor left in
	// it; one the store's column cannot hold selects none, and is a mistake.
	if p := msg.GetPhase(); p < 0 || p > store.MaxPhase {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("phase: %d is not a phase (1 to %d)", p, store.MaxPhase))
	}
	filter := store.ActionFilter{Project: msg.GetProject(), Domain: msg.GetDomain(), Run: msg.GetRun(), Phase: msg.GetPhase(), Cluster: msg.Cluster}
	query := fingerprint("actions", filter.Project, filter.Domain, filter.Run, strconv.Itoa(int(filter.Phase)))
	if filter.Cluster != nil { // unset, the token is the one a release before clusters gave
		query = fingerprint("actions", query, "cluster", *filter.Cluster)
	}
	token, err := decodeToken(msg.GetPageToken(), query)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	rows, more, err := s.store.ListActions(ctx, filter, token.ID, s.page(msg.GetPageSize()))
	if err != nil {
		return nil, s.storeError(ctx, "listing actions", err)
	}
	resp := &eventsv1.ListActionsResponse{}
	if more { // so the last page has no token
		resp.NextPageToken = encodeToken(pageToken{Query: query, ID: rows[len(rows)-1].Cursor})
	}
	for _, r := range rows {
		resp.Actions = append(resp.Actions, r.Action)
	}
	return connect.NewResponse(resp), nil
}

// ListActionEvents implements EventsService.ListActionEvents.
func (s *Service) ListActionEvents(ctx context.Context, req *connect.Request[eventsv1.ListActionEventsRequest]) (*connect.Response[eventsv1.ListActionEventsResponse], error) {
	key := store.KeyOf(req.Msg.GetId())
	query := fingerprint("events", key.String())
	if c := req.Msg.Cluster; c != nil { // unset, the token is the one a release before clusters gave
		query = fingerprint("events", query, "cluster", *c)
	}
	token, err := decodeToken(req.Msg.GetPageToken(), query)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	rows, more, err := s.store.ListActionEvents(ctx, key, req.Msg.Cluster, token.eventCursor(), s.page(req.Msg.GetPageSize()))
	if err != nil {
		return nil, s.storeError(ctx, "listing an action's events", err)
	}
	resp := &eventsv1.ListActionEventsResponse{}
	if more { // so the last page has no token
		resp.NextPageToken = encodeToken(eventToken(query, rows[len(rows)-1].Cursor))
	}
	for _, r := range rows {
		resp.Events = append(resp.Events, r.Event)
	}
	return connect.NewResponse(resp), nil
}

// WatchActions implements EventsService.WatchActions.
func (s *Service) WatchActions(ctx context.Context, req *connect.Request[eventsv1.WatchActionsRequest], stream *connect.ServerStream[eventsv1.WatchActionsResponse]) error {
	filter := watch.Filter{Project: req.Msg.GetProject(), Domain: req.Msg.GetDomain(), Run: req.Msg.GetRun()}
	sub, err := s.hub.Subscribe(ctx, filter, auth.IdentityOf(auth.UserFrom(ctx)))
	if errors.Is(err, watch.ErrTooManyWatchers) {
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	defer s.hub.Unsubscribe(sub)
	// Headers go out now, so a client knows the watch is established before anything
	// it records afterwards.
	if err := stream.Send(nil); err != nil {
		return err
	}
	// A send to a client that stopped reading blocks until the server's write deadline
	// resets the stream; the error then ends the handler, and the deferred Unsubscribe
	// frees its place.
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.Done():
			return subscriptionEnded(sub)
		case a := <-sub.C():
			// An ended subscription's backlog is not sent: the client re-lists anyway.
			if isDone(sub) {
				return subscriptionEnded(sub)
			}
			if err := stream.Send(&eventsv1.WatchActionsResponse{Action: a}); err != nil {
				return err
			}
		}
	}
}

func isDone(sub *watch.Subscription) bool {
	select {
	case <-sub.Done():
		return true
	default:
		return false
	}
}

func subscriptionEnded(sub *watch.Subscription) error {
	if errors.Is(sub.Err(), watch.ErrOverflow) {
		return connect.NewError(connect.CodeResourceExhausted, sub.Err())
	}
	return connect.NewError(connect.CodeUnavailable, sub.Err())
}
