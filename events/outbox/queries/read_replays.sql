-- ReadReplays: up to @limit dead letters of sink @sink whose replay was requested, in
-- outbox order, so that one action's events go out again in the order they were
-- recorded.
SELECT id, sink, tx, position, project, domain, run, action, attempt, phase, version,
       occurred_at, recorded_at, event, detail, failed_at, attempts, replay_requested_at
FROM cloudevent_dead_letters
WHERE sink = @sink AND replay_requested_at IS NOT NULL
ORDER BY tx, position
LIMIT @limit
