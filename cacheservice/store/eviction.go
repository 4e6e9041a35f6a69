package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flytekube/backend/services/postgres"
)

// Hit is when Get last found a key.
type Hit struct {
	Key Key
	At  time.Time
}

// RecordHits stores when each key was last found, in one statement; a time earlier than
// the stored one changes nothing.
func (s *Store) RecordHits(ctx context.Context, hits []Hit) error {
	if len(hits) == 0 {
		return nil
	}
	n := len(hits)
	cols := [6][]string{}
	for i := range cols {
		cols[i] = make([]string, 0, n)
	}
	ats := make([]time.Time, 0, n)
	for _, h := range hits {
		k := h.Key
		for i, v := range []string{k.Project, k.Domain, k.TaskName, k.CacheVersion, k.Signature, k.InputsHash} {
			cols[i] = append(cols[i], v)
		}
		ats = append(ats, h.At)
	}
	_, err := s.pool.Exec(ctx, recordHitsSQL, pgx.StrictNamedArgs{
		"projects": cols[0], "domains": cols[1], "task_names": cols[2], "cache_versions": cols[3],
		"signatures": cols[4], "inputs_hashes": cols[5], "hit_ats": ats,
	})
	if err != nil {
		return fmt.Errorf("store: recording %d hits: %w", n, err)
	}
	return nil
}

// Usage is what one project's cache holds.
type Usage struct {
	Project string
	Entries int64
	Bytes   int64
}

// ProjectUsage returns each project's entries and outputs' total size.
func (s *Store) ProjectUsage(ctx context.Context) ([]Usage, error) {
	rows, err := s.pool.Query(ctx, projectUsageSQL)
	if err != nil {
		return nil, fmt.Errorf("store: reading the projects' usage: %w", err)
	}
	var u Usage
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Usage, error) {
		err := row.Scan(&u.Project, &u.Entries, &u.Bytes)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: reading the projects' usage: %w", err)
	}
	return out, nil
}

// Evicted is what one Evict removed.
type Evicted struct {
	Entries, Bytes int64
}

// Evict deletes project's least recently used entries (last hit, or last written when
// later), the fewest that remove at least entries entries and bytes bytes, at most limit
// in one statement; entries being written are skipped. Run it again for what is left.
func (s *Store) Evict(ctx context.Context, project string, entries, bytes int64, limit int) (Evicted, error) {
	rows, err := s.pool.Query(ctx, evictSQL, pgx.StrictNamedArgs{
		"project": project, "entries": entries, "bytes": bytes, "limit": limit,
	})
	if err != nil {
		return Evicted{}, fmt.Errorf("store: evicting from %s: %w", project, err)
	}
	var e Evicted
	var size int64
	_, err = pgx.ForEachRow(rows, []any{&size}, func() error {
		e.Entries++
		e.Bytes += size
		return nil
	})
	if err != nil {
		return Evicted{}, fmt.Errorf("store: evicting from %s: %w", project, err)
	}
	return e, nil
}

// WithEvictionLock runs fn unless another replica holds the eviction lock
// (postgres.LockCacheEviction), and reports whether it ran: replicas evicting at once
// would delete the same project's entries, each counting the others' deletes as still
// to do. The lock is a session's, held on a connection of its own for fn's length and
// given up after, whatever fn returns.
func (s *Store) WithEvictionLock(ctx context.Context, fn func(ctx context.Context) error) (bool, error) {
	ran, err := postgres.WithSessionLock(ctx, s.pool, postgres.LockCacheEviction, false, func(*pgx.Conn) error { return fn(ctx) })
	if err != nil && !ran {
		return false, fmt.Errorf("store: taking the eviction lock: %w", err)
	}
	return ran, err
}
