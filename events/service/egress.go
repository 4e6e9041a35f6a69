package service

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/events/cloudevents"
	"github.com/flytekube/backend/events/outbox"
	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
)

// Egress implements flyte.events.v1.EgressService: the CloudEvents sinks this replica is
// configured with, and their dead letters.
type Egress struct {
	outbox *outbox.Outbox
	sinks  []cloudevents.Config
	log    *slog.Logger
}

var _ eventsv1connect.EgressServiceHandler = (*Egress)(nil)

// NewEgress serves ob's dead letters and the state of sinks.
func NewEgress(ob *outbox.Outbox, sinks []cloudevents.Config, log *slog.Logger) *Egress {
	return &Egress{outbox: ob, sinks: sinks, log: log}
}

// ListSinks implements EgressService.ListSinks.
func (e *Egress) ListSinks(ctx context.Context, _ *connect.Request[eventsv1.ListSinksRequest]) (*connect.Response[eventsv1.ListSinksResponse], error) {
	resp := &eventsv1.ListSinksResponse{}
	for _, s := range e.sinks {
		pending, oldest, err := e.outbox.Lag(ctx, s.Name())
		if errors.Is(err, outbox.ErrUnknownSink) {
			pending, err = 0, nil // not registered yet: no leader has started since it was added
		}
		if err != nil {
			return nil, e.storeError(ctx, "measuring a sink's backlog", err)
		}
		dead, err := e.outbox.CountDeadLetters(ctx, s.Name())
		if err != nil {
			return nil, e.storeError(ctx, "counting a sink's dead letters", err)
		}
		sink := &eventsv1.Sink{Name: s.Name(), Kind: string(s.Kind()), Target: s.Target(), Pending: uint64(max(pending, 0)), DeadLetters: uint64(max(dead, 0))}
		if !oldest.IsZero() {
			sink.OldestPending = timestamppb.New(oldest)
		}
		resp.Sinks = append(resp.Sinks, sink)
	}
	return connect.NewResponse(resp), nil
}

// ListDeadLetters implements EgressService.ListDeadLetters.
func (e *Egress) ListDeadLetters(ctx context.Context, req *connect.Request[eventsv1.ListDeadLettersRequest]) (*connect.Response[eventsv1.ListDeadLettersResponse], error) {
	letters, next, err := e.outbox.ListDeadLetters(ctx, outbox.DeadLetterFilter{
		Sink: req.Msg.GetSink(), PageSize: pageSize(req.Msg.GetPageSize()), PageToken: req.Msg.GetPageToken(),
	})
	if errors.Is(err, outbox.ErrInvalidPageToken) {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err != nil {
		return nil, e.storeError(ctx, "listing dead letters", err)
	}
	resp := &eventsv1.ListDeadLettersResponse{NextPageToken: next}
	redact := e.keptRedactors()
	for _, dl := range letters {
		detail := dl.Detail
		if r, ok := redact[dl.Sink]; ok {
			detail = r(detail)
		}
		resp.DeadLetters = append(resp.DeadLetters, &eventsv1.DeadLetter{
			Id: dl.ID, Sink: dl.Sink, Event: dl.Entry.Event, Detail: detail,
			FailedAt: timestamppb.New(dl.FailedAt), Attempts: uint32(max(dl.Attempts, 0)),
			ReplayRequested: !dl.ReplayRequestedAt.IsZero(),
		})
	}
	return connect.NewResponse(resp), nil
}

// keptRedactors redact, by sink name, the details of dead letters kept before details
// were redacted, which may hold what a receiver echoed of the request (its token, its
// URL). A sink's letters of then are kept under its name of then, its LegacyName.
func (e *Egress) keptRedactors() map[string]func(string) string {
	redactors := make([]func(string) string, len(e.sinks))
	out := make(map[string]func(string) string, 2*len(e.sinks))
	for i, s := range e.sinks {
		redactors[i] = s.RedactKept()
		if legacy := s.LegacyName(); legacy != "" {
			out[legacy] = redactors[i]
		}
	}
	// Second, so that a sink's own name wins over another's old one.
	for i, s := range e.sinks {
		out[s.Name()] = redactors[i]
	}
	return out
}

// ReplayDeadLetters implements EgressService.ReplayDeadLetters.
func (e *Egress) ReplayDeadLetters(ctx context.Context, req *connect.Request[eventsv1.ReplayDeadLettersRequest]) (*connect.Response[eventsv1.ReplayDeadLettersResponse], error) {
	n, err := e.outbox.RequestReplay(ctx, req.Msg.GetSink(), req.Msg.GetIds())
	if err != nil {
		return nil, e.storeError(ctx, "asking for a replay of dead letters", err)
	}
	return connect.NewResponse(&eventsv1.ReplayDeadLettersResponse{Requested: uint32(max(n, 0))}), nil
}

func (e *Egress) storeError(ctx context.Context, what string, err error) *connect.Error {
	return databaseError(ctx, e.log, what, err)
}
