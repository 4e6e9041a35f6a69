-- +goose Up

-- When a replica configured with the sink last said so (events/outbox/queries/add_sinks.sql).
-- The relay's leader removes the cursor of a sink it is not configured with only once no
-- replica has said so for a long while (register_sinks.sql): during a rollout that adds
-- a sink, a leader of the old configuration keeps the new sink's cursor, so the sink
-- misses nothing. The default is a constant for the rows there are, so adding the column
-- rewrites nothing, and a release before it inserts its sinks as it did.
ALTER TABLE cloudevent_sinks ADD COLUMN configured_at timestamptz NOT NULL DEFAULT now();

-- +goose Down
-- Down undoes this file alone, before any code uses the column; squawk's rule is for
-- dropping what running code reads.
-- squawk-ignore ban-drop-column
ALTER TABLE cloudevent_sinks DROP COLUMN configured_at;
