-- +goose Up

-- cached_output_committed reports whether a key has an entry, as committed when it is
-- called: a PL/pgSQL function is never inlined, and in READ COMMITTED each of its
-- queries takes a snapshot of its own, later than the calling statement's. A lookup that
-- has just taken a reservation asks it, in the same statement, whether a holder stored
-- the entry and released the reservation after the statement's own read. It takes no
-- lock on a table until it is called.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cached_output_committed(p text, d text, t text, v text, s text, i text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM cached_outputs WHERE project = p AND domain = d AND task_name = t
        AND cache_version = v AND signature = s AND inputs_hash = i);
END
$$;
-- +goose StatementEnd
