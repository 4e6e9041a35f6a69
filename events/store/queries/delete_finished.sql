-- DeleteFinished: up to @limit actions that finished before @cutoff, with their events.
WITH doomed AS (
    -- An action finishes after it is created, so every action finished before the cutoff
    -- was created before it: the created_at index narrows the search.
    SELECT project, domain, run, action FROM actions
    WHERE created_at < @cutoff AND rank = @terminal_rank AND occurred_at < @cutoff
    ORDER BY created_at
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
),
gone_events AS (
    DELETE FROM action_events e USING doomed d
    WHERE e.project = d.project AND e.domain = d.domain AND e.run = d.run AND e.action = d.action
),
gone AS (
    DELETE FROM actions a USING doomed d
    WHERE a.project = d.project AND a.domain = d.domain AND a.run = d.run AND a.action = d.action
    RETURNING 1
)
SELECT count(*) FROM gone
