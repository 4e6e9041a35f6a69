-- RegisterSinks: makes the configured sinks (@names) the registered ones, in one
-- statement: a new name gets a cursor at the current end of the outbox, a name no longer
-- configured loses its cursor (so it stops holding trimming back), and a name already
-- registered keeps its cursor.
--
-- The current end is the horizon that read.sql reads up to: every transaction below the
-- snapshot's xmin has ended, so a cursor of (xmin, 0, 0) (positions and ordinals start at
-- 1) stands after every event of those and before every event of a transaction still
-- running or yet to come. A new sink thus gets every event whose transaction commits after it is
-- registered, and perhaps a few committed just before.
WITH removed AS (
    DELETE FROM cloudevent_sinks WHERE name <> ALL (@names::text[])
    RETURNING name
),
added AS (
    INSERT INTO cloudevent_sinks (name, after_tx, after_position, after_ordinal)
    SELECT DISTINCT name, pg_snapshot_xmin(pg_current_snapshot()), 0, 0
    FROM unnest(@names::text[]) AS name
    ON CONFLICT (name) DO NOTHING
    RETURNING name
)
SELECT true AS added, name FROM added
UNION ALL
SELECT false, name FROM removed
ORDER BY 2
