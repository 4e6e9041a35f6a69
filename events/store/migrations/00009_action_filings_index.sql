-- +goose NO TRANSACTION
-- +goose Up

-- Retention finds a partition's actions by filed_at, which changes only when retention
-- re-files an action, so updates of an action stay HOT. Built concurrently, as 00007's
-- index is, and for the same reasons. actions_by_age stays while the previous release's
-- retention, which searches created_at, may run.
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS actions_by_filing;
-- +goose StatementEnd
-- +goose StatementBegin
-- Not IF NOT EXISTS: that would keep an invalid index a failed build left; the
-- drop above makes the file safe to run again.
-- squawk-ignore prefer-robust-stmts
CREATE INDEX CONCURRENTLY actions_by_filing ON actions (filed_at);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS actions_by_filing;
-- +goose StatementEnd
