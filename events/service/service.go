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
	"github.com/flytekube/backend/services/postgres"
)

// DefaultPageSize is used when a listing asks for page size 0.
const DefaultPageSize = 100

// Service implements flyte.events.v1.EventsService.
type Service struct {
	store   *store.Store
	hub     *watch.Hub
	log     *slog.Logger
	metrics *Metrics
}

var _ eventsv1connect.EventsServiceHandler = (*Service)(nil)

// New creates the service. The hub must be running (watch.Hub.Run) for WatchActions to
// serve; m is shared with the hub (Metrics.Watch).
func New(st *store.Store, hub *watch.Hub, m *Metrics, log *slog.Logger) *Service {
	return &Service{store: st, hub: hub, log: log, metrics: m}
}

// Record implements EventsService.Record.
func (s *Service) Record(ctx context.Context, req *connect.Request[eventsv1.RecordRequest]) (*connect.Response[eventsv1.RecordResponse], error) {
	events := req.Msg.GetEvents()
	s.metrics.received.Add(float64(len(events)))
	s.metrics.batchSize.Observe(float64(len(events)))
	start := time.Now()
	res, err := s.store.Record(ctx, events)
	if err != nil {
		s.metrics.record.WithLabelValues("error").Observe(time.Since(start).Seconds())
		s.log.ErrorContext(ctx, "recording events", "events", len(events), "error", err)
		return nil, postgres.RPCError(err)
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
	action, err := s.store.GetAction(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no events recorded for action %s", key))
	}
	if err != nil {
		return nil, postgres.RPCError(err)
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
	filter := store.ActionFilter{Project: msg.GetProject(), Domain: msg.GetDomain(), Run: msg.GetRun(), Phase: msg.GetPhase()}
	query := fingerprint("actions", filter.Project, filter.Domain, filter.Run, strconv.Itoa(int(filter.Phase)))
	token, err := decodeToken(msg.GetPageToken(), query)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	size := pageSize(msg.GetPageSize())
	// One extra row says whether another page exists, so the last page has no token.
	rows, err := s.store.ListActions(ctx, filter, token.ID, size+1)
	if err != nil {
		return nil, postgres.RPCError(err)
	}
	resp := &eventsv1.ListActionsResponse{}
	if len(rows) > size {
		rows = rows[:size]
		resp.NextPageToken = encodeToken(pageToken{Query: query, ID: rows[size-1].Cursor})
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
	token, err := decodeToken(req.Msg.GetPageToken(), query)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	after := store.EventCursor{Attempt: token.Attempt, Phase: token.Phase, Version: token.Version}
	if token.Occurred != 0 {
		after.OccurredAt = time.Unix(0, token.Occurred).UTC()
	}
	size := pageSize(req.Msg.GetPageSize())
	rows, err := s.store.ListActionEvents(ctx, key, after, size+1)
	if err != nil {
		return nil, postgres.RPCError(err)
	}
	resp := &eventsv1.ListActionEventsResponse{}
	if len(rows) > size {
		rows = rows[:size]
		c := rows[size-1].Cursor
		resp.NextPageToken = encodeToken(pageToken{Query: query, Attempt: c.Attempt, Occurred: c.OccurredAt.UnixNano(), Phase: c.Phase, Version: c.Version})
	}
	for _, r := range rows {
		resp.Events = append(resp.Events, r.Event)
	}
	return connect.NewResponse(resp), nil
}

// WatchActions implements EventsService.WatchActions.
func (s *Service) WatchActions(ctx context.Context, req *connect.Request[eventsv1.WatchActionsRequest], stream *connect.ServerStream[eventsv1.WatchActionsResponse]) error {
	filter := watch.Filter{Project: req.Msg.GetProject(), Domain: req.Msg.GetDomain(), Run: req.Msg.GetRun()}
	sub, err := s.hub.Subscribe(ctx, filter)
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	defer s.hub.Unsubscribe(sub)
	// Headers go out now, so a client knows the watch is established before anything
	// it records afterwards.
	if err := stream.Send(nil); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.Done():
			switch {
			case errors.Is(sub.Err(), watch.ErrOverflow):
				return connect.NewError(connect.CodeResourceExhausted, sub.Err())
			default:
				return connect.NewError(connect.CodeUnavailable, sub.Err())
			}
		case a := <-sub.C():
			if err := stream.Send(&eventsv1.WatchActionsResponse{Action: a}); err != nil {
				return err
			}
		}
	}
}
