-- Retention's re-filing: up to @limit actions filed in [@from, @to) that had not
-- finished before @cutoff are filed at @now instead; their events follow
-- (refile_events.sql). Locked in key order, as Record locks them.
WITH stragglers AS (
    SELECT project, domain, run, action FROM actions
    WHERE filed_at >= @from AND filed_at < @to
      AND NOT (rank = @terminal_rank AND occurred_at < @cutoff)
    ORDER BY project, domain, run, action
    LIMIT @limit
    FOR UPDATE
)
UPDATE actions a SET filed_at = @now
FROM stragglers s
WHERE a.project = s.project AND a.domain = s.domain AND a.run = s.run AND a.action = s.action
RETURNING a.project, a.domain, a.run, a.action
