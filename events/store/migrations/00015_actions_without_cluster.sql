-- +goose NO TRANSACTION
-- +goose Up

-- The actions the previous release recorded, which name no cluster (00012), until the
-- partitions' maintenance has given each its cluster, read from its event
-- (Store.backfillClusters): this finds them without a scan of the table, and empties
-- as they are done. Built concurrently, as 00009's index is.
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS actions_without_cluster;
-- +goose StatementEnd
-- +goose StatementBegin
-- Not IF NOT EXISTS: that would keep an invalid index a failed build left; the
-- drop above makes the file safe to run again.
-- squawk-ignore prefer-robust-stmts
CREATE INDEX CONCURRENTLY actions_without_cluster ON actions (id) WHERE cluster IS NULL;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS actions_without_cluster;
-- +goose StatementEnd
