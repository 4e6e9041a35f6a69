package store

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	eventsv1 "github.com/flytekube/backend/gen/go/flyte/events/v1"
	"github.com/flytekube/backend/services/postgres"
)

// An action is its name and its cluster (migrations 00012 to 00017). This release still
// runs beside the previous one, whose key is the name alone, so the schema keeps that
// key, and the previous release writes rows that name no cluster. What the next
// release's contract needs before it drops the old key is done here, in the background:
// each partition of action_events gets its part of the key with the cluster, and each
// action the previous release recorded gets the cluster its event names, with its events.

var (
	//go:embed queries/partitions_without_cluster_key.sql
	partitionsWithoutClusterKeySQL string
	//go:embed queries/actions_without_cluster.sql
	actionsWithoutClusterSQL string
	//go:embed queries/backfill_clusters.sql
	backfillClustersSQL string
)

// clusterKey is the partitioned index each partition's key with the cluster is attached
// to (00016); once every partition has one, Postgres marks it valid.
const clusterKey = "action_events_cluster_key"

// backfillBatch is how many actions one transaction of the backfill gives their cluster.
const backfillBatch = 1000

// ClusterKeysResult says what one CompleteClusterKeys pass did.
type ClusterKeysResult struct {
	// Skipped says another replica was at it.
	Skipped bool
	// Keyed are the partitions whose key with the cluster was built.
	Keyed []string
	// Backfilled counts the actions given their cluster.
	Backfilled int
	// Done says nothing is left: every partition has its key, no action lacks a cluster.
	Done bool
}

// CompleteClusterKeys builds the key with the cluster of each partition that has none,
// concurrently, and attaches it, then gives up to maxBatches batches of the previous
// release's actions their cluster. One replica at a time does it (postgres.LockEventsClusters);
// the others skip. The partitions' own lock is not held meanwhile: building a large
// partition's index takes minutes, and a Record that finds no partition must not wait for
// it. Retention dropping a partition waits for a build on it, and the build for a drop.
func (s *Store) CompleteClusterKeys(ctx context.Context, maxBatches int) (ClusterKeysResult, error) {
	var res ClusterKeysResult
	held, err := postgres.WithSessionLock(ctx, s.pool, postgres.LockEventsClusters, false, func(conn *pgx.Conn) error {
		parts, err := partitionsWithoutClusterKey(ctx, conn)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if err := keyPartition(ctx, conn, p); err != nil {
				return err
			}
			res.Keyed = append(res.Keyed, p)
		}
		for range maxBatches {
			n, err := backfillClusters(ctx, conn)
			if err != nil {
				return err
			}
			res.Backfilled += n
			if n < backfillBatch {
				res.Done = true
				break
			}
		}
		return nil
	})
	res.Skipped = !held
	if err != nil {
		return res, fmt.Errorf("store: completing the keys with the cluster: %w", err)
	}
	return res, nil
}

func partitionsWithoutClusterKey(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, partitionsWithoutClusterKeySQL)
	if err != nil {
		return nil, fmt.Errorf("listing partitions without the key: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// keyPartition builds a partition's key with the cluster concurrently, and attaches it
// to clusterKey. A build that failed before (a lost connection, a cancel) leaves an
// invalid index of the name, which is dropped first.
func keyPartition(ctx context.Context, conn *pgx.Conn, partition string) error {
	index := pgx.Identifier{partition + "_cluster_key"}.Sanitize()
	var valid pgtype.Bool
	if err := conn.QueryRow(ctx, `SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1))`, partition+"_cluster_key").Scan(&valid); err != nil {
		return fmt.Errorf("reading the key of %s: %w", partition, err)
	}
	if valid.Valid && !valid.Bool {
		if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+index); err != nil {
			return fmt.Errorf("dropping the invalid key of %s: %w", partition, err)
		}
	}
	build := "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS " + index + " ON " + pgx.Identifier{partition}.Sanitize() +
		" (project, domain, run, action, attempt, phase, version, filed_at, cluster) NULLS NOT DISTINCT"
	if _, err := conn.Exec(ctx, build); err != nil {
		return fmt.Errorf("building the key of %s: %w", partition, err)
	}
	if _, err := conn.Exec(ctx, "ALTER INDEX "+clusterKey+" ATTACH PARTITION "+index); err != nil {
		return fmt.Errorf("attaching the key of %s: %w", partition, err)
	}
	return nil
}

// backfillClusters gives one batch of the previous release's actions, and their events,
// the cluster of their event, and returns how many it read.
func backfillClusters(ctx context.Context, conn *pgx.Conn) (int, error) {
	rows, err := conn.Query(ctx, actionsWithoutClusterSQL, pgx.StrictNamedArgs{"limit": backfillBatch})
	if err != nil {
		return 0, fmt.Errorf("reading actions without a cluster: %w", err)
	}
	var (
		ids      []int64
		clusters []string
		id       int64
		encoded  []byte
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &encoded}, func() error {
		var ev eventsv1.ActionEvent
		if err := decodeEvent(encoded, &ev); err != nil {
			return fmt.Errorf("decoding the event of action %d: %w", id, err)
		}
		ids, clusters = append(ids, id), append(clusters, ev.GetCluster())
		return nil
	}); err != nil {
		return 0, fmt.Errorf("reading actions without a cluster: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if _, err := conn.Exec(ctx, backfillClustersSQL, ids, clusters); err != nil {
		return 0, fmt.Errorf("giving %d actions their cluster: %w", len(ids), err)
	}
	return len(ids), nil
}
