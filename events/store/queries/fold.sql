-- Record's fold, after the batch's events went in within the same transaction: each
-- action's winning event ($1-$11, one per action, sorted by key) replaces the action's
-- state only when greater, in the order of (attempt, rank, version, occurred_at, phase).
-- Running after the event inserts, it locks actions after events, as every writer must,
-- or two batches could deadlock.
--
-- The changed actions' keys are joined into notifications of up to $12 keys, on channel
-- $13. pg_notify is volatile, so Postgres calls it even though no statement reads the
-- notifications column.
--
-- The parameters of Record's statements are numbered, not named like the others': pgx
-- rewrites names by lexing the whole statement on every call, 77 µs for this one, as
-- much CPU as a batch's first few events cost.
WITH upserted AS (
    INSERT INTO actions AS a (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event)
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::text[],
        $5::integer[], $6::smallint[], $7::integer[], $8::smallint[],
        $9::timestamptz[], $10::timestamptz[], $11::bytea[])
    ON CONFLICT (project, domain, run, action) DO UPDATE
    SET attempt = EXCLUDED.attempt, phase = EXCLUDED.phase, version = EXCLUDED.version,
        rank = EXCLUDED.rank, occurred_at = EXCLUDED.occurred_at, event = EXCLUDED.event,
        created_at = LEAST(a.created_at, EXCLUDED.created_at)
    WHERE (EXCLUDED.attempt, EXCLUDED.rank, EXCLUDED.version, EXCLUDED.occurred_at, EXCLUDED.phase)
        > (a.attempt, a.rank, a.version, a.occurred_at, a.phase)
    RETURNING project, domain, run, action
),
numbered AS (
    SELECT project || '/' || domain || '/' || run || '/' || action AS key,
           (row_number() OVER () - 1) / $12::integer AS chunk
    FROM upserted
),
chunks AS (
    SELECT string_agg(key, E'\n') AS payload, count(*) AS keys FROM numbered GROUP BY chunk
),
notified AS (
    SELECT coalesce(sum(keys), 0)::bigint AS changed, count(pg_notify($13::text, payload)) AS notifications
    FROM chunks
)
SELECT changed FROM notified
