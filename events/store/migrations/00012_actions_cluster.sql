-- +goose Up

-- The cluster that runs an action becomes part of its identity, so that two clusters'
-- actions of the same name are two actions (docs/operations.md, "Several clusters").
-- NULL is a row the previous release wrote, which names no cluster: Record adopts it
-- for the cluster of the action's next event (store.adopt). The column has no default,
-- so adding it is a catalog change, under the runner's lock_timeout.
ALTER TABLE actions ADD COLUMN IF NOT EXISTS cluster text;

-- +goose Down
-- Not reversed: a rollback is the previous release running on this schema, which
-- ignores the column.
