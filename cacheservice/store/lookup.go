package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
)

// Lookup is what LookupOrReserve found: a hit's Output, or the key's Reservation and
// what asking for it did.
type Lookup struct {
	Output      *cachev1.CachedOutput
	Reservation Reservation
	Outcome     Outcome
}

// LookupRequest is a lookup that reserves the key on a miss.
type LookupRequest struct {
	Key       Key
	Claimant  Claimant
	Heartbeat time.Duration
	Grace     int
	// MaxAge, when positive, makes an entry last written longer ago count as absent.
	MaxAge time.Duration
	// SkipLookup reserves without reading the entry.
	SkipLookup bool
}

// LookupOrReserve returns the entry of r.Key, or else takes or extends its reservation
// as GetOrExtendReservation does. A reservation it newly takes (granted, or taken over)
// was free, so a holder may have stored the entry and released it after the first
// read: it reads again, and on a hit gives the reservation back and returns the hit, so
// that the work never runs twice for want of a second look.
func (s *Store) LookupOrReserve(ctx context.Context, r LookupRequest) (Lookup, error) {
	if !r.SkipLookup {
		out, err := s.Get(ctx, r.Key, r.MaxAge)
		if err == nil {
			return Lookup{Output: out}, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return Lookup{}, err
		}
	}
	res, outcome, err := s.GetOrExtendReservation(ctx, r.Key, r.Claimant, r.Heartbeat, r.Grace)
	if err != nil {
		return Lookup{}, err
	}
	if r.SkipLookup || (outcome != Granted && outcome != TakenOver) {
		return Lookup{Reservation: res, Outcome: outcome}, nil
	}
	out, err := s.Get(ctx, r.Key, r.MaxAge)
	switch {
	case errors.Is(err, ErrNotFound):
		return Lookup{Reservation: res, Outcome: outcome}, nil
	case err != nil:
		return Lookup{}, err
	}
	if _, err := s.ReleaseReservation(ctx, r.Key, r.Claimant); err != nil {
		return Lookup{}, fmt.Errorf("store: giving back the reservation of %s after a late hit: %w", r.Key, err)
	}
	return Lookup{Output: out}, nil
}
