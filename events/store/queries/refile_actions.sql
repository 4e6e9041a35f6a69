-- Retention's re-filing: up to @limit actions filed in [@from, @to) that had not
-- finished before @cutoff, and are not abandoned (unfinished, their newest state older
-- than @abandon_cutoff: delete_abandoned.sql drops them), are filed anew; their events
-- follow (refile_events.sql). Locked in key order, as Record locks them.
--
-- An action that finished since the cutoff is filed at @now, and goes a TTL later. An
-- unfinished one is filed where it can stay until it would be abandoned, @hold after its
-- newest state (no earlier than @now, no later than @hold_until, the end of the
-- partitions made for it): retention moves it again only if it is still going by then,
-- not at every pass, however many unfinished actions there are. An action is its name
-- and its cluster (NULL: recorded by the release before clusters); each is moved alone.
WITH stragglers AS (
    SELECT id FROM actions
    WHERE filed_at >= @from AND filed_at < @to
      AND NOT (rank = @terminal_rank AND occurred_at < @cutoff)
      AND NOT (rank < @terminal_rank AND occurred_at < @abandon_cutoff)
    ORDER BY project, domain, run, action, cluster
    LIMIT @limit
    FOR UPDATE
)
UPDATE actions a SET filed_at = CASE
        WHEN a.rank = @terminal_rank THEN @now::timestamptz
        ELSE least(greatest(@now::timestamptz, a.occurred_at + @hold::interval), @hold_until::timestamptz)
    END
FROM stragglers s
WHERE a.id = s.id
RETURNING a.project, a.domain, a.run, a.action, a.cluster, a.filed_at
