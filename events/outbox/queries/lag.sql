-- Lag: how far sink @sink is behind: the events after its cursor in at most @cap rows
-- (an exact count over a long backlog would walk all of it on every scrape), and the
-- earliest recorded_at among those rows. Rows of committed transactions above the read
-- horizon count too: a long transaction holding the horizon back shows here. The counts
-- are read from their column, so no row's events are read.
SELECT coalesce(sum(p.count - CASE WHEN (p.tx, p.position) = (s.after_tx, s.after_position) THEN s.after_ordinal ELSE 0 END), 0)::bigint,
       min(p.recorded_at)
FROM cloudevent_sinks s
LEFT JOIN LATERAL (
    SELECT o.tx, o.position, o.count, o.recorded_at FROM event_outbox o
    WHERE (o.tx, o.position) >= (s.after_tx, s.after_position)
      AND (o.tx, o.position, o.count) > (s.after_tx, s.after_position, s.after_ordinal)
    ORDER BY o.tx, o.position
    LIMIT @cap
) p ON true
WHERE s.name = @sink
GROUP BY s.name
