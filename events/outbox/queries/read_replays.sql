-- ReadReplays: up to @limit dead letters of sink @sink whose replay was requested, in
-- outbox order, so that one action's events go out again in the order they were
-- recorded.
-- (The key columns are not read: the event carries them.)
SELECT id, sink, tx, position, ordinal, recorded_at, event, detail, failed_at, attempts, replay_requested_at
FROM cloudevent_dead_letters
WHERE sink = @sink AND replay_requested_at IS NOT NULL
ORDER BY tx, position, ordinal
LIMIT @limit
