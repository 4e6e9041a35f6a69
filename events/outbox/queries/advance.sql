-- Advance: moves the cursor of sink @sink to (@tx, @position, @ordinal), never backwards:
-- it takes the greater of the two places. No row comes back for an unknown sink.
UPDATE cloudevent_sinks
SET (after_tx, after_position, after_ordinal) = (
        SELECT tx, position, ordinal
        FROM (VALUES (after_tx, after_position, after_ordinal),
                     (@tx::xid8, @position::bigint, @ordinal::integer)) AS place (tx, position, ordinal)
        ORDER BY tx DESC, position DESC, ordinal DESC
        LIMIT 1),
    updated_at = now()
WHERE name = @sink
