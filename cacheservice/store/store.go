// Package store keeps cached task outputs and reservations in Postgres.
//
// Every operation is one SQL statement, so it is atomic and correct under any number of
// concurrent callers without reading first and writing after: Put is a conditional upsert
// whose result says who won, and a reservation is taken, extended or taken over by one
// conditional upsert as well. Times come from the database clock, so the service's
// replicas agree on expiry.
package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"maps"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	cachev1 "github.com/flytekube/backend/gen/go/flyte/cache/v1"
	flytecorev1 "github.com/flytekube/backend/gen/go/flyte/core/v1"
	"github.com/flytekube/backend/services/postgres"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are the cache service's schema migrations.
func Migrations() postgres.Migrations {
	return postgres.EmbeddedMigrations(postgres.ServiceCache, migrationFiles, "migrations")
}

var (
	// ErrNotFound is returned when there is no (fresh enough) entry.
	ErrNotFound = errors.New("no cached output")
	// ErrExists is returned by Put when an entry exists and may not be replaced.
	ErrExists = errors.New("a cached output exists")
	// ErrContended is returned when a reservation changed under every attempt to read it;
	// trying again is the remedy.
	ErrContended = errors.New("the reservation kept changing under contention")
)

// Key is a cache key's parts, in primary-key order.
type Key struct {
	Project, Domain, TaskName, CacheVersion, Signature, InputsHash string
}

// KeyOf converts the protobuf key.
func KeyOf(k *cachev1.CacheKey) Key {
	return Key{k.GetProject(), k.GetDomain(), k.GetTaskName(), k.GetCacheVersion(), k.GetSignature(), k.GetInputsHash()}
}

// Proto converts back.
func (k Key) Proto() *cachev1.CacheKey {
	return &cachev1.CacheKey{Project: k.Project, Domain: k.Domain, TaskName: k.TaskName,
		CacheVersion: k.CacheVersion, Signature: k.Signature, InputsHash: k.InputsHash}
}

// args names the key's parts for a statement, and the statement's other parameters.
func (k Key) args(others pgx.StrictNamedArgs) pgx.StrictNamedArgs {
	args := pgx.StrictNamedArgs{"project": k.Project, "domain": k.Domain, "task_name": k.TaskName,
		"cache_version": k.CacheVersion, "signature": k.Signature, "inputs_hash": k.InputsHash}
	maps.Copy(args, others)
	return args
}

// String is for messages.
func (k Key) String() string {
	return fmt.Sprintf("%s/%s/%s@%s (signature %s, inputs %s)", k.Project, k.Domain, k.TaskName, k.CacheVersion, k.Signature, k.InputsHash)
}

// The store's statements, one file each in queries/, where they are explained.
var (
	//go:embed queries/get.sql
	getSQL string
	//go:embed queries/put.sql
	putSQL string
	//go:embed queries/delete.sql
	deleteSQL string
	//go:embed queries/invalidate.sql
	invalidateSQL string
	//go:embed queries/lookup_or_reserve.sql
	lookupOrReserveSQL string
	//go:embed queries/release_reservation.sql
	releaseReservationSQL string
	//go:embed queries/delete_expired_reservations.sql
	deleteExpiredReservationsSQL string
	//go:embed queries/delete_old_entries.sql
	deleteOldEntriesSQL string
	//go:embed queries/put_and_release.sql
	releasedAfterPutSQL string
	//go:embed queries/record_hits.sql
	recordHitsSQL string
	//go:embed queries/project_usage.sql
	projectUsageSQL string
	//go:embed queries/evict.sql
	evictSQL string

	// putAndReleaseSQL is put.sql's statement with the release after it.
	putAndReleaseSQL = "WITH put AS (\n" + putSQL + "\n)\n" + releasedAfterPutSQL
)

// Store reads and writes entries and reservations.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a store over a migrated database.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// scanOutput reads an entry's columns, in the order get.sql and put.sql select them, then
// any extra columns into extra.
func scanOutput(row pgx.Row, k Key, extra ...any) (*cachev1.CachedOutput, error) {
	var (
		out                 = &cachev1.CachedOutput{Key: k.Proto(), SourceAction: &flytecorev1.ActionIdentifier{}}
		attempt             int32
		createdAt, updateAt time.Time
	)
	err := row.Scan(append([]any{&out.OutputUri, &out.SourceAction.Project, &out.SourceAction.Domain, &out.SourceAction.Run,
		&out.SourceAction.Action, &attempt, &createdAt, &updateAt}, extra...)...)
	if err != nil {
		return nil, err
	}
	out.SourceAttempt = uint32(attempt)
	out.CreatedAt, out.UpdatedAt = timestamp(createdAt), timestamp(updateAt)
	return out, nil
}

// maxAgeSeconds turns an optional max age into a SQL parameter: NULL for none.
func maxAgeSeconds(maxAge time.Duration) *float64 {
	if maxAge <= 0 {
		return nil
	}
	s := maxAge.Seconds()
	return &s
}

// Get returns the entry for k, or ErrNotFound when there is none or, with maxAge > 0,
// when it was last written longer ago than maxAge.
func (s *Store) Get(ctx context.Context, k Key, maxAge time.Duration) (*cachev1.CachedOutput, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	row := s.pool.QueryRow(ctx, getSQL, k.args(pgx.StrictNamedArgs{"max_age_seconds": maxAgeSeconds(maxAge)}))
	out, err := scanOutput(row, k)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: reading %s: %w", k, err)
	}
	return out, nil
}

// PutRequest is an entry to store.
type PutRequest struct {
	Key           Key
	OutputURI     string
	Source        *flytecorev1.ActionIdentifier
	SourceAttempt uint32
	// Overwrite replaces any existing entry.
	Overwrite bool
	// MaxAge, when positive, lets an entry last written longer ago than this be replaced.
	MaxAge time.Duration
	// OutputBytes is the outputs' size, counted against the project's bound.
	OutputBytes uint64
}

// PutResult is the stored entry and whether it replaced another.
type PutResult struct {
	Output   *cachev1.CachedOutput
	Replaced bool
}

func (r PutRequest) check() error {
	src := r.Source
	if r.SourceAttempt > math.MaxInt32 {
		return &FieldError{"source_attempt", "does not fit the stored integer"}
	}
	if r.OutputBytes > math.MaxInt64 {
		return &FieldError{"output_bytes", "does not fit the stored integer"}
	}
	return checkTexts(append(r.Key.texts(),
		textField{"output_uri", r.OutputURI, maxOutputURIBytes},
		textField{"source_action.project", src.GetProject(), maxNameBytes}, textField{"source_action.domain", src.GetDomain(), maxNameBytes},
		textField{"source_action.run", src.GetRun(), maxNameBytes}, textField{"source_action.action", src.GetAction(), maxNameBytes},
	)...)
}

// Put stores an entry, or returns ErrExists when one exists that may not be replaced.
// Of concurrent Puts of one key without Overwrite, exactly one succeeds.
func (s *Store) Put(ctx context.Context, r PutRequest) (PutResult, error) {
	if err := r.check(); err != nil {
		return PutResult{}, err
	}
	row := s.pool.QueryRow(ctx, putSQL, r.args(nil))
	var replaced bool
	out, err := scanOutput(row, r.Key, &replaced)
	if errors.Is(err, pgx.ErrNoRows) {
		return PutResult{}, ErrExists
	}
	if err != nil {
		return PutResult{}, fmt.Errorf("store: storing %s: %w", r.Key, err)
	}
	return PutResult{Output: out, Replaced: replaced}, nil
}

// args names put.sql's parameters, and others.
func (r PutRequest) args(others pgx.StrictNamedArgs) pgx.StrictNamedArgs {
	src := r.Source
	args := r.Key.args(pgx.StrictNamedArgs{
		"output_uri":     r.OutputURI,
		"source_project": src.GetProject(), "source_domain": src.GetDomain(),
		"source_run": src.GetRun(), "source_action": src.GetAction(), "source_attempt": int32(r.SourceAttempt),
		"overwrite": r.Overwrite, "max_age_seconds": maxAgeSeconds(r.MaxAge), "output_bytes": int64(r.OutputBytes),
	})
	maps.Copy(args, others)
	return args
}

// PutAndRelease stores an entry as Put does and, in the same statement, deletes k's
// reservation if c holds it, reporting whether it did. When an entry exists that may
// not be replaced it returns ErrExists and changes nothing: the reservation stays.
func (s *Store) PutAndRelease(ctx context.Context, r PutRequest, c Claimant) (PutResult, bool, error) {
	if err := errors.Join(r.check(), c.check()); err != nil {
		return PutResult{}, false, err
	}
	row := s.pool.QueryRow(ctx, putAndReleaseSQL, r.args(pgx.StrictNamedArgs{"owner_id": c.OwnerID, "holder": c.Identity}))
	var replaced, released bool
	out, err := scanOutput(row, r.Key, &replaced, &released)
	if errors.Is(err, pgx.ErrNoRows) {
		return PutResult{}, false, ErrExists
	}
	if err != nil {
		return PutResult{}, false, fmt.Errorf("store: storing %s and releasing it: %w", r.Key, err)
	}
	return PutResult{Output: out, Replaced: replaced}, released, nil
}

// Delete removes the entry for k and reports whether there was one.
func (s *Store) Delete(ctx context.Context, k Key) (bool, error) {
	if err := k.check(); err != nil {
		return false, err
	}
	tag, err := s.pool.Exec(ctx, deleteSQL, k.args(nil))
	if err != nil {
		return false, fmt.Errorf("store: deleting %s: %w", k, err)
	}
	return tag.RowsAffected() > 0, nil
}

// Invalidate removes every entry of a task, or of one of its cache versions when
// version is not empty, and returns how many went.
func (s *Store) Invalidate(ctx context.Context, project, domain, task, version string) (int64, error) {
	err := checkTexts(textField{"project", project, maxNameBytes}, textField{"domain", domain, maxNameBytes},
		textField{"task_name", task, maxTaskNameBytes}, textField{"cache_version", version, maxKeyPartBytes})
	if err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, invalidateSQL,
		pgx.StrictNamedArgs{"project": project, "domain": domain, "task_name": task, "cache_version": version})
	if err != nil {
		return 0, fmt.Errorf("store: invalidating %s/%s/%s: %w", project, domain, task, err)
	}
	return tag.RowsAffected(), nil
}

// Outcome says what GetOrExtendReservation did.
type Outcome int

const (
	// Granted: there was no reservation; the caller has it now.
	Granted Outcome = iota + 1
	// Extended: the caller held it and extended it.
	Extended
	// TakenOver: another owner's reservation had expired; the caller has it now.
	TakenOver
	// Refused: another claimant holds it.
	Refused
)

// Claimant is who asks for a reservation: the owner_id it names its work by, and the
// identity it authenticated as. A reservation is extended or released only when both
// are the holder's, since an owner_id alone is guessable. Run and Action, when set,
// name the action it computes the key for (in the key's project and domain), which
// those it refuses are told.
type Claimant struct {
	OwnerID, Identity string
	Run, Action       string
}

func (c Claimant) check() error {
	return checkTexts(textField{"owner_id", c.OwnerID, maxOwnerIDBytes}, textField{"caller identity", c.Identity, maxIdentityNameBytes},
		textField{"action.run", c.Run, maxNameBytes}, textField{"action.action", c.Action, maxNameBytes})
}

// Reservation is a key's reservation. OwnerID is set only when the caller holds it: an
// owner_id is not the others' to know. HolderRun and HolderAction name the action the
// holder computes for, when it named one, and are told to everyone.
type Reservation struct {
	OwnerID                 string
	HolderRun, HolderAction string
	Heartbeat               time.Duration
	ExpiresAt               time.Time
}

// nullIfEmpty is a text parameter that is NULL when empty.
func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// GetOrExtendReservation takes k's reservation for c when it is free or expired, extends
// it when c holds it, and otherwise returns the holder's heartbeat and expiry. The
// reservation lasts heartbeat x grace from now.
func (s *Store) GetOrExtendReservation(ctx context.Context, k Key, c Claimant, heartbeat time.Duration, grace int) (Reservation, Outcome, error) {
	got, err := s.lookupOrReserve(ctx, LookupRequest{Key: k, Claimant: c, Heartbeat: heartbeat, Grace: grace, SkipLookup: true})
	return got.Reservation, got.Outcome, err
}

// lookupOrReserve runs lookup_or_reserve.sql: r.Key's entry, or else what its upsert of
// the reservation did.
func (s *Store) lookupOrReserve(ctx context.Context, r LookupRequest) (Lookup, error) {
	k, c := r.Key, r.Claimant
	if err := errors.Join(k.check(), c.check()); err != nil {
		return Lookup{}, err
	}
	args := k.args(pgx.StrictNamedArgs{
		"owner_id": c.OwnerID, "holder": c.Identity, "heartbeat_seconds": r.Heartbeat.Seconds(), "grace": r.Grace,
		"holder_run": nullIfEmpty(c.Run), "holder_action": nullIfEmpty(c.Action),
		"skip_lookup": r.SkipLookup, "max_age_seconds": maxAgeSeconds(r.MaxAge),
	})
	// The read of a reservation the statement did not take uses a snapshot that may
	// predate it; then nothing comes back, and it is run again.
	for range 5 {
		var (
			kind                               string
			uri, srcProject, srcDomain, srcRun *string
			srcAction                          *string
			attempt                            *int32
			createdAt, updatedAt               *time.Time
			heartbeat                          *time.Duration
			expiresAt                          *time.Time
			holderRun, holderAction            *string
			acquired, inserted, extended       bool
			storedSince                        bool
		)
		err := s.pool.QueryRow(ctx, lookupOrReserveSQL, args).Scan(&kind, &uri, &srcProject, &srcDomain, &srcRun, &srcAction,
			&attempt, &createdAt, &updatedAt, &heartbeat, &expiresAt, &holderRun, &holderAction, &acquired, &inserted, &extended, &storedSince)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return Lookup{}, fmt.Errorf("store: looking up or reserving %s: %w", k, err)
		}
		if kind == "hit" {
			return Lookup{Output: &cachev1.CachedOutput{
				Key: k.Proto(), OutputUri: *uri, SourceAttempt: uint32(*attempt),
				SourceAction: &flytecorev1.ActionIdentifier{Project: *srcProject, Domain: *srcDomain, Run: *srcRun, Action: *srcAction},
				CreatedAt:    timestamp(*createdAt), UpdatedAt: timestamp(*updatedAt),
			}}, nil
		}
		res := Reservation{Heartbeat: *heartbeat, ExpiresAt: *expiresAt}
		late := storedSince
		if holderRun != nil && holderAction != nil {
			res.HolderRun, res.HolderAction = *holderRun, *holderAction
		}
		switch {
		case !acquired:
			return Lookup{Reservation: res, Outcome: Refused}, nil
		case inserted:
			res.OwnerID = c.OwnerID
			return Lookup{Reservation: res, Outcome: Granted, late: late}, nil
		case extended:
			res.OwnerID = c.OwnerID
			return Lookup{Reservation: res, Outcome: Extended}, nil
		default:
			res.OwnerID = c.OwnerID
			return Lookup{Reservation: res, Outcome: TakenOver, late: late}, nil
		}
	}
	return Lookup{}, fmt.Errorf("store: reserving %s: %w", k, ErrContended)
}

// ReleaseReservation deletes k's reservation if c holds it, and reports whether it did.
func (s *Store) ReleaseReservation(ctx context.Context, k Key, c Claimant) (bool, error) {
	if err := errors.Join(k.check(), c.check()); err != nil {
		return false, err
	}
	tag, err := s.pool.Exec(ctx, releaseReservationSQL, k.args(pgx.StrictNamedArgs{"owner_id": c.OwnerID, "holder": c.Identity}))
	if err != nil {
		return false, fmt.Errorf("store: releasing %s: %w", k, err)
	}
	return tag.RowsAffected() > 0, nil
}

// DeleteExpiredReservations removes up to limit reservations that expired before now.
func (s *Store) DeleteExpiredReservations(ctx context.Context, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, deleteExpiredReservationsSQL, pgx.StrictNamedArgs{"limit": limit})
	if err != nil {
		return 0, fmt.Errorf("store: deleting expired reservations: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeleteOldEntries removes up to limit entries last written before cutoff.
func (s *Store) DeleteOldEntries(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, deleteOldEntriesSQL, pgx.StrictNamedArgs{"cutoff": cutoff, "limit": limit})
	if err != nil {
		return 0, fmt.Errorf("store: deleting old entries: %w", err)
	}
	return tag.RowsAffected(), nil
}
