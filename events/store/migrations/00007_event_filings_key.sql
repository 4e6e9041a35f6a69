-- +goose NO TRANSACTION
-- +goose Up

-- The key the partitioned table will have, holding the filing: built concurrently
-- (writes go on; the build waits for none of them and none waits for it), so outside a
-- transaction. A build that failed leaves an invalid index behind; the file is run again
-- whole, so it drops what a failed run may have left first. No lock_timeout is set: the
-- build's lock (SHARE UPDATE EXCLUSIVE) blocks no read or write.
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS action_events_filed_key;
-- +goose StatementEnd
-- +goose StatementBegin
-- Not IF NOT EXISTS: that would keep an invalid index a failed build left; the
-- drop above makes the file safe to run again.
-- squawk-ignore prefer-robust-stmts
CREATE UNIQUE INDEX CONCURRENTLY action_events_filed_key
    ON action_events (project, domain, run, action, attempt, phase, version, filed_at);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP INDEX CONCURRENTLY IF EXISTS action_events_filed_key;
-- +goose StatementEnd
