-- Record's statement: inserts a batch's events and folds each action's winning event
-- into actions, announcing the actions whose state moved.
--
-- The events ($12-$20) go in with ON CONFLICT DO NOTHING, so a redelivered event is
-- absorbed; a batch of new events is copied in first, in the same transaction, and
-- passes empty arrays here. The winners ($1-$11, one per action, sorted by key) replace
-- an action's state only when greater, in the order of (attempt, rank, version,
-- occurred_at, phase). The fold reads inserted_count so that it waits for the event
-- inserts: every statement locks events before actions, or two batches could deadlock.
--
-- The changed actions' keys are joined into notifications of up to $21 keys, on channel
-- $22. pg_notify is volatile, so Postgres calls it even though no statement reads the
-- notifications column.
--
-- Its parameters are numbered, not named like the other statements': pgx rewrites names
-- by lexing the whole statement on every call, 77 µs here, as much CPU as a batch's
-- first few events cost.
WITH inserted AS (
    INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event)
    SELECT * FROM unnest(
        $12::text[], $13::text[], $14::text[], $15::text[],
        $16::integer[], $17::smallint[], $18::integer[], $19::timestamptz[], $20::bytea[])
    ON CONFLICT DO NOTHING
    RETURNING 1
),
inserted_count AS (
    SELECT count(*) AS n FROM inserted
),
upserted AS (
    INSERT INTO actions AS a (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event)
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::text[],
        $5::integer[], $6::smallint[], $7::integer[], $8::smallint[],
        $9::timestamptz[], $10::timestamptz[], $11::bytea[])
    WHERE (SELECT n FROM inserted_count) >= 0
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
           (row_number() OVER () - 1) / $21::integer AS chunk
    FROM upserted
),
chunks AS (
    SELECT string_agg(key, E'\n') AS payload, count(*) AS keys FROM numbered GROUP BY chunk
),
notified AS (
    SELECT coalesce(sum(keys), 0)::bigint AS changed,
           count(pg_notify($22::text, payload)) AS notifications
    FROM chunks
)
SELECT (SELECT n FROM inserted_count), changed FROM notified
