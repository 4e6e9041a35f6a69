-- Advance: moves the cursor of sink @sink to (@tx, @position), never backwards (an older
-- position leaves it where it is). No row comes back for an unknown sink.
UPDATE cloudevent_sinks
SET (after_tx, after_position, updated_at) = (
    CASE WHEN (after_tx, after_position) < (@tx::xid8, @position::bigint) THEN @tx::xid8 ELSE after_tx END,
    CASE WHEN (after_tx, after_position) < (@tx::xid8, @position::bigint) THEN @position::bigint ELSE after_position END,
    now())
WHERE name = @sink
