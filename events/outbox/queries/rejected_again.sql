-- RejectedAgain: the sink refused dead letter @id again: what it said replaces the
-- detail, and the letter waits for another replay request.
UPDATE cloudevent_dead_letters
SET detail = @detail, failed_at = now(), attempts = attempts + 1, replay_requested_at = NULL
WHERE id = @id
