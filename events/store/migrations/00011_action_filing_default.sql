-- +goose Up

-- The previous release's replicas name no filing when they record a new action; from
-- now on it takes the one the tree's Record gives (Store.filingTime): the present,
-- unless no partition holds it yet, then the newest partition's last microsecond. Filed
-- at -infinity (00005), such actions would keep landing in the partition from before
-- partitioning, and fail once retention has dropped it, or lose their events if one
-- landed there while it was being dropped. A default is read when a row is inserted, so
-- setting it is a catalog change: lock_timeout bounds the wait for its lock.
-- +goose StatementBegin
CREATE FUNCTION action_filing() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT least(now(), max(btrim(b[2], '''')::timestamptz) - interval '1 microsecond')
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid,
         regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \((.*)\) TO \((.*)\)') AS b
    WHERE i.inhparent = 'action_events'::regclass AND b[2] <> 'MAXVALUE'
$$;
-- +goose StatementEnd
SET LOCAL lock_timeout = '2s';
ALTER TABLE actions ALTER COLUMN filed_at SET DEFAULT action_filing();

-- +goose Down
SET LOCAL lock_timeout = '2s';
ALTER TABLE actions ALTER COLUMN filed_at SET DEFAULT '-infinity';
DROP FUNCTION action_filing();
