-- +goose Up

-- Each event keeps the cluster of its action (00012), on the partitioned table and so on
-- every partition: a catalog change on each, under the runner's lock_timeout. NULL is an event the
-- previous release wrote; reads take it as their action's.
ALTER TABLE action_events ADD COLUMN IF NOT EXISTS cluster text;

-- +goose Down
-- Not reversed: a rollback is the previous release running on this schema, which
-- ignores the column.
