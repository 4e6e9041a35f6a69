-- Record's statement: inserts a batch's events and folds each action's winning event
-- into actions, announcing the actions whose state moved.
--
-- The events (@event_*) go in with ON CONFLICT DO NOTHING, so a redelivered event is
-- absorbed; a batch of new events is copied in first, in the same transaction, and
-- passes empty arrays here. The winners (@projects through @events, one per action,
-- sorted by key) replace an action's state only when greater, in the order of
-- (attempt, rank, version, occurred_at, phase). The fold reads inserted_count so that it
-- waits for the event inserts: every statement locks events before actions, or two
-- batches could deadlock.
--
-- The changed actions' keys are joined into notifications of up to
-- @keys_per_notification keys. pg_notify is volatile, so Postgres calls it even though
-- no statement reads the notifications column.
WITH inserted AS (
    INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event)
    SELECT * FROM unnest(
        @event_projects::text[], @event_domains::text[], @event_runs::text[], @event_actions::text[],
        @event_attempts::integer[], @event_phases::smallint[], @event_versions::integer[],
        @event_occurred_at::timestamptz[], @event_events::bytea[])
    ON CONFLICT DO NOTHING
    RETURNING 1
),
inserted_count AS (
    SELECT count(*) AS n FROM inserted
),
upserted AS (
    INSERT INTO actions AS a (project, domain, run, action, attempt, phase, version, rank, occurred_at, created_at, event)
    SELECT * FROM unnest(
        @projects::text[], @domains::text[], @runs::text[], @actions::text[],
        @attempts::integer[], @phases::smallint[], @versions::integer[], @ranks::smallint[],
        @occurred_at::timestamptz[], @created_at::timestamptz[], @events::bytea[])
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
           (row_number() OVER () - 1) / @keys_per_notification::integer AS chunk
    FROM upserted
),
chunks AS (
    SELECT string_agg(key, E'\n') AS payload, count(*) AS keys FROM numbered GROUP BY chunk
),
notified AS (
    SELECT coalesce(sum(keys), 0)::bigint AS changed,
           count(pg_notify(@channel::text, payload)) AS notifications
    FROM chunks
)
SELECT (SELECT n FROM inserted_count), changed FROM notified
