// Package service is the CacheService RPC edge: requests (already validated by the
// server's protovalidate interceptor) become store calls, and errors become RPC codes.
// A database outage is Unavailable, so callers (the executor treats any cache error as
// a miss) can tell it from a real miss. A reservation belongs to the owner_id and the
// authenticated identity that took it.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flytekube/backend/cacheservice/store"
	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/services/auth"
)

// Reservations shape the reservations the service grants.
type Reservations struct {
	// MinHeartbeat is the shortest heartbeat interval granted: a shorter one would make a
	// reservation that expires as it is granted (and the database keeps intervals to the
	// microsecond, so a nanosecond is 0 s), letting every caller take it over.
	MinHeartbeat time.Duration
	// MaxHeartbeat caps the heartbeat interval a caller may ask for.
	MaxHeartbeat time.Duration
	// GraceMultiplier: a reservation expires after this many missed heartbeats.
	GraceMultiplier int
}

// grant is the heartbeat interval granted to a caller that asked for asked.
func (r Reservations) grant(asked time.Duration) time.Duration {
	return min(max(asked, r.MinHeartbeat), r.MaxHeartbeat)
}

// Service implements flyte.cache.v1.CacheService.
type Service struct {
	store   *store.Store
	res     Reservations
	metrics *Metrics
	hits    *Hits
	log     *slog.Logger
}

var _ cachev1connect.CacheServiceHandler = (*Service)(nil)

// New creates the service; hits, when not nil, collects when entries are found.
func New(st *store.Store, res Reservations, m *Metrics, hits *Hits, log *slog.Logger) *Service {
	return &Service{store: st, res: res, metrics: m, hits: hits, log: log}
}

// Get implements CacheService.Get.
func (s *Service) Get(ctx context.Context, req *connect.Request[cachev1.GetRequest]) (*connect.Response[cachev1.GetResponse], error) {
	key := store.KeyOf(req.Msg.GetKey())
	out, err := s.store.Get(ctx, key, req.Msg.GetMaxAge().AsDuration())
	if errors.Is(err, store.ErrNotFound) {
		s.metrics.gets.WithLabelValues("miss").Inc()
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("%w for %s", err, key))
	}
	if err != nil {
		return nil, s.storeError(ctx, "Get", err)
	}
	s.metrics.gets.WithLabelValues("hit").Inc()
	s.hits.Hit(key)
	return connect.NewResponse(&cachev1.GetResponse{Output: out}), nil
}

// Put implements CacheService.Put.
func (s *Service) Put(ctx context.Context, req *connect.Request[cachev1.PutRequest]) (*connect.Response[cachev1.PutResponse], error) {
	res, err := s.store.Put(ctx, putRequest(req.Msg))
	if err != nil {
		return nil, s.putError(ctx, "Put", req.Msg, err)
	}
	s.countPut(res)
	return connect.NewResponse(&cachev1.PutResponse{Output: res.Output}), nil
}

func putRequest(m *cachev1.PutRequest) store.PutRequest {
	return store.PutRequest{
		Key: store.KeyOf(m.GetKey()), OutputURI: m.GetOutputUri(),
		Source: m.GetSourceAction(), SourceAttempt: m.GetSourceAttempt(),
		Overwrite: m.GetOverwrite(), MaxAge: m.GetMaxAge().AsDuration(), OutputBytes: m.GetOutputBytes(),
	}
}

func (s *Service) putError(ctx context.Context, rpc string, m *cachev1.PutRequest, err error) error {
	if errors.Is(err, store.ErrExists) {
		s.metrics.puts.WithLabelValues("conflict").Inc()
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%w for %s; set overwrite or max_age to replace it", err, store.KeyOf(m.GetKey())))
	}
	return s.storeError(ctx, rpc, err)
}

func (s *Service) countPut(res store.PutResult) {
	result := "stored"
	if res.Replaced {
		result = "replaced"
	}
	s.metrics.puts.WithLabelValues(result).Inc()
}

// PutAndRelease implements CacheService.PutAndRelease.
func (s *Service) PutAndRelease(ctx context.Context, req *connect.Request[cachev1.PutAndReleaseRequest]) (*connect.Response[cachev1.PutAndReleaseResponse], error) {
	put := req.Msg.GetPut()
	res, released, err := s.store.PutAndRelease(ctx, putRequest(put), claimant(ctx, req.Msg.GetOwnerId(), nil))
	if err != nil {
		return nil, s.putError(ctx, "PutAndRelease", put, err)
	}
	s.countPut(res)
	s.countRelease(released)
	return connect.NewResponse(&cachev1.PutAndReleaseResponse{Output: res.Output, Released: released}), nil
}

// Delete implements CacheService.Delete.
func (s *Service) Delete(ctx context.Context, req *connect.Request[cachev1.DeleteRequest]) (*connect.Response[cachev1.DeleteResponse], error) {
	deleted, err := s.store.Delete(ctx, store.KeyOf(req.Msg.GetKey()))
	if err != nil {
		return nil, s.storeError(ctx, "Delete", err)
	}
	if deleted {
		s.metrics.deleted.Inc()
	}
	return connect.NewResponse(&cachev1.DeleteResponse{Deleted: deleted}), nil
}

// Invalidate implements CacheService.Invalidate.
func (s *Service) Invalidate(ctx context.Context, req *connect.Request[cachev1.InvalidateRequest]) (*connect.Response[cachev1.InvalidateResponse], error) {
	m := req.Msg
	n, err := s.store.Invalidate(ctx, m.GetProject(), m.GetDomain(), m.GetTaskName(), m.GetCacheVersion())
	if err != nil {
		return nil, s.storeError(ctx, "Invalidate", err)
	}
	s.metrics.deleted.Add(float64(n))
	s.log.InfoContext(ctx, "invalidated cache entries", "project", m.GetProject(), "domain", m.GetDomain(),
		"task", m.GetTaskName(), "cache_version", m.GetCacheVersion(), "deleted", n)
	return connect.NewResponse(&cachev1.InvalidateResponse{Deleted: uint64(n)}), nil
}

var outcomeNames = map[store.Outcome]string{
	store.Granted: "granted", store.Extended: "extended", store.TakenOver: "taken_over", store.Refused: "refused",
}

// GetOrExtendReservation implements CacheService.GetOrExtendReservation.
func (s *Service) GetOrExtendReservation(ctx context.Context, req *connect.Request[cachev1.GetOrExtendReservationRequest]) (*connect.Response[cachev1.GetOrExtendReservationResponse], error) {
	m := req.Msg
	key := store.KeyOf(m.GetKey())
	heartbeat := s.res.grant(m.GetHeartbeatInterval().AsDuration())
	res, outcome, err := s.store.GetOrExtendReservation(ctx, key, claimant(ctx, m.GetOwnerId(), m.GetAction()), heartbeat, s.res.GraceMultiplier)
	if err != nil {
		return nil, s.storeError(ctx, "GetOrExtendReservation", err)
	}
	s.metrics.reservations.WithLabelValues(outcomeNames[outcome]).Inc()
	return connect.NewResponse(&cachev1.GetOrExtendReservationResponse{
		Reservation: reservation(key, res), Acquired: outcome != store.Refused,
	}), nil
}

// reservation is res of key as the contract has it. The key is rebuilt rather than the
// request's echoed, and the owner_id is empty when refused: the store gives it only to
// its holder.
func reservation(key store.Key, res store.Reservation) *cachev1.Reservation {
	r := &cachev1.Reservation{
		Key:               key.Proto(),
		OwnerId:           res.OwnerID,
		HeartbeatInterval: durationpb.New(res.Heartbeat),
		ExpiresAt:         timestamppb.New(res.ExpiresAt),
	}
	if res.HolderAction != "" {
		r.HolderAction = &flytecorev1.ActionIdentifier{Project: key.Project, Domain: key.Domain, Run: res.HolderRun, Action: res.HolderAction}
	}
	return r
}

// LookupOrReserve implements CacheService.LookupOrReserve. It counts as the Get and the
// GetOrExtendReservation it stands for.
func (s *Service) LookupOrReserve(ctx context.Context, req *connect.Request[cachev1.LookupOrReserveRequest]) (*connect.Response[cachev1.LookupOrReserveResponse], error) {
	m := req.Msg
	key := store.KeyOf(m.GetKey())
	got, err := s.store.LookupOrReserve(ctx, store.LookupRequest{
		Key: key, Claimant: claimant(ctx, m.GetOwnerId(), m.GetAction()),
		Heartbeat: s.res.grant(m.GetHeartbeatInterval().AsDuration()), Grace: s.res.GraceMultiplier,
		MaxAge: m.GetMaxAge().AsDuration(), SkipLookup: m.GetSkipLookup(),
	})
	if err != nil {
		return nil, s.storeError(ctx, "LookupOrReserve", err)
	}
	if got.Output != nil {
		s.metrics.gets.WithLabelValues("hit").Inc()
		s.hits.Hit(key)
		return connect.NewResponse(&cachev1.LookupOrReserveResponse{
			Result: &cachev1.LookupOrReserveResponse_Output{Output: got.Output},
		}), nil
	}
	if !m.GetSkipLookup() {
		s.metrics.gets.WithLabelValues("miss").Inc()
	}
	s.metrics.reservations.WithLabelValues(outcomeNames[got.Outcome]).Inc()
	return connect.NewResponse(&cachev1.LookupOrReserveResponse{
		Result:   &cachev1.LookupOrReserveResponse_Reservation{Reservation: reservation(key, got.Reservation)},
		Acquired: got.Outcome != store.Refused,
	}), nil
}

// ReleaseReservation implements CacheService.ReleaseReservation.
func (s *Service) ReleaseReservation(ctx context.Context, req *connect.Request[cachev1.ReleaseReservationRequest]) (*connect.Response[cachev1.ReleaseReservationResponse], error) {
	released, err := s.store.ReleaseReservation(ctx, store.KeyOf(req.Msg.GetKey()), claimant(ctx, req.Msg.GetOwnerId(), nil))
	if err != nil {
		return nil, s.storeError(ctx, "ReleaseReservation", err)
	}
	s.countRelease(released)
	return connect.NewResponse(&cachev1.ReleaseReservationResponse{Released: released}), nil
}

func (s *Service) countRelease(released bool) {
	result := "ignored"
	if released {
		result = "released"
	}
	s.metrics.releases.WithLabelValues(result).Inc()
}

// claimant is the caller as a reservation knows it: the owner_id it gave, the identity
// it authenticated as (anonymous when authentication is off) and the action it named,
// if any (validated to be in the key's project and domain).
func claimant(ctx context.Context, ownerID string, action *flytecorev1.ActionIdentifier) store.Claimant {
	return store.Claimant{OwnerID: ownerID, Identity: auth.IdentityOf(auth.UserFrom(ctx)), Run: action.GetRun(), Action: action.GetAction()}
}
