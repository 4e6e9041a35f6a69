-- Lag: how far sink @sink is behind: the entries after its cursor, counted up to @cap
-- (an exact count over a long backlog would walk all of it on every scrape), and the
-- earliest recorded_at among them. Entries of committed transactions above the read
-- horizon count too: a long transaction holding the horizon back shows here.
SELECT count(p.recorded_at), min(p.recorded_at)
FROM cloudevent_sinks s
LEFT JOIN LATERAL (
    SELECT e.recorded_at FROM event_outbox e
    WHERE (e.tx, e.position) > (s.after_tx, s.after_position)
    ORDER BY e.tx, e.position
    LIMIT @cap
) p ON true
WHERE s.name = @sink
GROUP BY s.name
