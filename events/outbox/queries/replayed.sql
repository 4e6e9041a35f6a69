-- Replayed: the sink took dead letter @id when it was published again.
DELETE FROM cloudevent_dead_letters WHERE id = @id
