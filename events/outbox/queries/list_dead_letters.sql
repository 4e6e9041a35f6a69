-- ListDeadLetters: up to @limit dead letters after id @after, in id order (the order they
-- were first refused), of sink @sink or of every sink when it is NULL.
-- (The key columns are not read: the event carries them.)
SELECT id, sink, tx, position, ordinal, recorded_at, event, detail, failed_at, attempts, replay_requested_at
FROM cloudevent_dead_letters
WHERE (@sink::text IS NULL OR sink = @sink::text) AND id > @after
ORDER BY id
LIMIT @limit
