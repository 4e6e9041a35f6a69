-- Read: up to @limit entries after the cursor of sink @sink, in (tx, position) order.
--
-- Positions are handed out before commit, so transactions commit out of position order
-- and a reader of "position > cursor" would pass over an entry whose transaction commits
-- late. Entries are therefore read only from transactions that have ended: every
-- transaction whose id is below the snapshot's xmin has committed or rolled back, so no
-- entry can appear later below the cursor. One action's Records run one after another, so
-- a later one has a larger transaction id; within one transaction the trigger numbers an
-- action's events in order. A transaction open for long anywhere in the cluster holds the
-- horizon back: that is lag, never loss.
--
-- The sink's row comes back even when nothing is pending (the entry's columns are then
-- NULL), so an unknown sink is told apart from an empty outbox in one round trip.
SELECT o.tx, o.position, o.project, o.domain, o.run, o.action, o.attempt, o.phase, o.version,
       o.occurred_at, o.recorded_at, o.event
FROM cloudevent_sinks s
LEFT JOIN LATERAL (
    SELECT * FROM event_outbox e
    WHERE (e.tx, e.position) > (s.after_tx, s.after_position)
      AND e.tx < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY e.tx, e.position
    LIMIT @limit
) o ON true
WHERE s.name = @sink
ORDER BY o.tx, o.position
