-- +goose NO TRANSACTION
-- +goose Up

-- The key actions will have once the previous release's is dropped (a contract, in the
-- release after this one): the name and the cluster. Record's upsert names it from now
-- on, so that this release works on that schema too. While the old key (project,
-- domain, run, action) remains, a name one cluster holds is refused to another
-- (store.NameTakenError) rather than overwritten. NULLS NOT DISTINCT: the rows of the
-- previous release, which name no cluster, are one action per name, as they were.
-- Built concurrently, as 00009's index is.
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS actions_cluster_key;
-- +goose StatementEnd
-- +goose StatementBegin
-- Not IF NOT EXISTS: that would keep an invalid index a failed build left; the
-- drop above makes the file safe to run again.
-- squawk-ignore prefer-robust-stmts
CREATE UNIQUE INDEX CONCURRENTLY actions_cluster_key ON actions (project, domain, run, action, cluster) NULLS NOT DISTINCT;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS actions_cluster_key;
-- +goose StatementEnd
