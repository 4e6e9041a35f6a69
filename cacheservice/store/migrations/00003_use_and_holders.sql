-- +goose Up

-- output_bytes is the outputs' size as their writer told it, and last_hit_at when a Get
-- last found the entry (written in batches, not on every hit): together they bound a
-- project's cache, the least recently used entries going first. An entry never hit
-- counts as used when it was last written, which greatest() gives, since it skips a NULL.
ALTER TABLE cached_outputs ADD COLUMN output_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_hit_at timestamptz;
CREATE INDEX cached_outputs_by_use ON cached_outputs (project, (greatest(updated_at, last_hit_at)));

-- holder_run and holder_action name the action a reservation's holder computes the key
-- for (in the key's project and domain), so that those it refuses can say whom they wait
-- on. NULL when the holder named none.
ALTER TABLE reservations ADD COLUMN holder_run text, ADD COLUMN holder_action text;

-- +goose Down
ALTER TABLE reservations DROP COLUMN holder_action, DROP COLUMN holder_run;
DROP INDEX cached_outputs_by_use;
ALTER TABLE cached_outputs DROP COLUMN last_hit_at, DROP COLUMN output_bytes;
