-- RequestReplay: asks the relay to publish again the dead letters @ids of sink @sink, or
-- all of the sink's when @ids is empty. A letter already waiting keeps its request time.
UPDATE cloudevent_dead_letters
SET replay_requested_at = coalesce(replay_requested_at, now())
WHERE sink = @sink AND (cardinality(@ids::bigint[]) = 0 OR id = ANY (@ids::bigint[]))
