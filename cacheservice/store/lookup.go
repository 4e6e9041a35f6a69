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
	// late: the reservation was newly taken, and the entry was stored after the read.
	late bool
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
// as GetOrExtendReservation does, in one statement. A reservation it newly takes
// (granted, or taken over) was free, so a holder may have stored the entry and released
// it after the statement's snapshot: the statement checks, and then the store reads the
// entry, gives the reservation back and returns the hit, so that the work never runs
// twice for want of a second look.
func (s *Store) LookupOrReserve(ctx context.Context, r LookupRequest) (Lookup, error) {
	got, err := s.lookupOrReserve(ctx, r)
	if err != nil || !got.late {
		return got, err
	}
	out, err := s.Get(ctx, r.Key, r.MaxAge)
	switch {
	case errors.Is(err, ErrNotFound):
		return got, nil
	case err != nil:
		return Lookup{}, err
	}
	if _, err := s.ReleaseReservation(ctx, r.Key, r.Claimant); err != nil {
		return Lookup{}, fmt.Errorf("store: giving back the reservation of %s after a late hit: %w", r.Key, err)
	}
	return Lookup{Output: out}, nil
}
