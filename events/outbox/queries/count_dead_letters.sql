-- CountDeadLetters: how many dead letters sink @sink has (few: each is a refusal for
-- good), from the index of the sink's letters.
SELECT count(*) FROM cloudevent_dead_letters WHERE sink = @sink
