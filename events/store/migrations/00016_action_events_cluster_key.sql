-- +goose Up

-- The key events will have once the previous release's primary key, which names no
-- cluster, is dropped (the next release's contract): an event of one cluster's action
-- is then not absorbed as a redelivery of another's. Made ON ONLY the partitioned
-- table, which is a catalog change: it is not valid until each partition has its own
-- index attached. Partitions made from now on get theirs when they are attached
-- (store/partitions.go); the partitions' maintenance builds each existing partition's
-- concurrently and attaches it (Store.ensureClusterKeys).
-- squawk-ignore require-concurrent-index-creation
CREATE UNIQUE INDEX IF NOT EXISTS action_events_cluster_key ON ONLY action_events
    (project, domain, run, action, attempt, phase, version, filed_at, cluster) NULLS NOT DISTINCT;

-- +goose Down
-- Not reversed: a rollback is the previous release running on this schema, which
-- ignores the index.
