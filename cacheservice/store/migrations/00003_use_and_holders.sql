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

-- cached_output_committed reports whether a key has an entry, as committed when it is
-- called: a PL/pgSQL function is never inlined, and in READ COMMITTED each of its
-- queries takes a snapshot of its own, later than the calling statement's. A lookup that
-- has just taken a reservation asks it, in the same statement, whether a holder stored
-- the entry and released the reservation after the statement's own read.
-- +goose StatementBegin
CREATE FUNCTION cached_output_committed(p text, d text, t text, v text, s text, i text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM cached_outputs WHERE project = p AND domain = d AND task_name = t
        AND cache_version = v AND signature = s AND inputs_hash = i);
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION cached_output_committed;
ALTER TABLE reservations DROP COLUMN holder_action, DROP COLUMN holder_run;
DROP INDEX cached_outputs_by_use;
ALTER TABLE cached_outputs DROP COLUMN last_hit_at, DROP COLUMN output_bytes;
