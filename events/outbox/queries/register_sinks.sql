-- RegisterSinks: the relay leader's registration of the sinks it is configured with
-- (@names), in one statement: a new name gets a cursor at the current end of the outbox,
-- a name already registered keeps its cursor, and each is noted as configured now. A
-- sink the leader does not know keeps its cursor too: a replica of another
-- configuration (a rollout adding it) may need it. Only once no replica has noted a sink
-- as configured for @forget_after (NULL: never) is its cursor removed, so that a sink
-- taken out of the configuration stops holding trimming back.
--
-- The current end is the horizon that read.sql reads up to: every transaction below the
-- snapshot's xmin has ended, so a cursor of (xmin, 0, 0) (positions and ordinals start at
-- 1) stands after every event of those and before every event of a transaction still
-- running or yet to come. A new sink thus gets every event whose transaction commits after it is
-- registered, and perhaps a few committed just before.
WITH removed AS (
    DELETE FROM cloudevent_sinks
    WHERE name <> ALL (@names::text[]) AND configured_at < now() - @forget_after::interval
    RETURNING name
),
upserted AS (
    INSERT INTO cloudevent_sinks AS s (name, after_tx, after_position, after_ordinal)
    SELECT DISTINCT name, pg_snapshot_xmin(pg_current_snapshot()), 0, 0
    FROM unnest(@names::text[]) AS name
    ON CONFLICT (name) DO UPDATE SET configured_at = now()
    RETURNING name, xmax = 0 AS added
)
SELECT true AS added, name FROM upserted WHERE added
UNION ALL
SELECT false, name FROM removed
ORDER BY 2
