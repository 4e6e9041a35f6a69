-- Read: up to @limit events after the cursor of sink @sink, in (tx, position, ordinal)
-- order: the rest of the cursor's row, then the rows after it.
--
-- Positions are handed out before commit, so transactions commit out of position order
-- and a reader of "position > cursor" would pass over a row whose transaction commits
-- late. Rows are therefore read only from transactions that have ended: every
-- transaction whose id is below the snapshot's xmin has committed or rolled back, so no
-- row can appear later below the cursor. One action's Records run one after another, so
-- a later one has a larger transaction id; within a row, an action's events are in the
-- order Record inserted them. A transaction open for long anywhere in the cluster holds
-- the horizon back: that is lag, never loss.
--
-- The rows are chosen first, from their counts, as few as hold @limit pending events;
-- only their events are unnested. (Unnesting every pending row and sorting would read
-- the whole backlog: the planner cannot know that unnest numbers in order.)
--
-- The sink's row comes back even when nothing is pending (the event's columns are then
-- NULL), so an unknown sink is told apart from an empty outbox in one round trip.
WITH cursor AS (
    SELECT after_tx AS tx, after_position AS position, after_ordinal AS ordinal
    FROM cloudevent_sinks WHERE name = @sink
),
candidates AS (
    -- Rows with events pending, at most @limit (each holds at least one), with the
    -- pending events up to and including each. The cursor's values are scalar
    -- subqueries, computed once, so that the scan starts at the cursor in the index.
    SELECT o.tx, o.position,
           sum(o.count - CASE WHEN (o.tx, o.position) = (c.tx, c.position) THEN c.ordinal ELSE 0 END)
               OVER (ORDER BY o.tx, o.position ROWS UNBOUNDED PRECEDING) AS through,
           o.count - CASE WHEN (o.tx, o.position) = (c.tx, c.position) THEN c.ordinal ELSE 0 END AS pending
    FROM event_outbox o, cursor c
    WHERE (o.tx, o.position) >= ((SELECT tx FROM cursor), (SELECT position FROM cursor))
      AND o.tx < pg_snapshot_xmin(pg_current_snapshot())
      AND (o.tx, o.position, o.count) > (c.tx, c.position, c.ordinal)
    ORDER BY o.tx, o.position
    LIMIT @limit
),
pending AS (
    SELECT o.tx, o.position, u.ordinal::integer AS ordinal, o.recorded_at, u.event
    FROM candidates d
    JOIN event_outbox o ON (o.tx, o.position) = (d.tx, d.position)
    CROSS JOIN cursor c
    CROSS JOIN LATERAL unnest(o.events) WITH ORDINALITY AS u (event, ordinal)
    WHERE d.through - d.pending < @limit
      AND (o.tx, o.position, u.ordinal) > (c.tx, c.position, c.ordinal)
    ORDER BY o.tx, o.position, u.ordinal
    LIMIT @limit
)
SELECT p.tx, p.position, p.ordinal, p.recorded_at, p.event
FROM cursor
LEFT JOIN pending p ON true
ORDER BY p.tx, p.position, p.ordinal
