-- RenameSinks, one sink: moves what is kept under @old (a sink's earlier default name)
-- to @new, in one statement: the cursor, unless one under @new is further back already
-- (a replica of the new release registered it meanwhile; the older one loses nothing),
-- and the dead letters, but for those @new holds already (the same event refused under
-- both names).
WITH old_cursor AS (
    DELETE FROM cloudevent_sinks WHERE name = @old
    RETURNING after_tx, after_position, after_ordinal
),
moved_cursor AS (
    INSERT INTO cloudevent_sinks AS s (name, after_tx, after_position, after_ordinal)
    SELECT @new, after_tx, after_position, after_ordinal FROM old_cursor
    ON CONFLICT (name) DO UPDATE
        SET after_tx = EXCLUDED.after_tx, after_position = EXCLUDED.after_position,
            after_ordinal = EXCLUDED.after_ordinal, updated_at = now()
        WHERE (s.after_tx, s.after_position, s.after_ordinal) > (EXCLUDED.after_tx, EXCLUDED.after_position, EXCLUDED.after_ordinal)
    RETURNING name
),
duplicates AS (
    DELETE FROM cloudevent_dead_letters d
    WHERE d.sink = @old AND EXISTS (
        SELECT FROM cloudevent_dead_letters n
        WHERE n.sink = @new AND n.tx = d.tx AND n.position = d.position AND n.ordinal = d.ordinal)
    RETURNING id
),
moved_letters AS (
    UPDATE cloudevent_dead_letters SET sink = @new
    WHERE sink = @old AND id NOT IN (SELECT id FROM duplicates)
    RETURNING id
)
SELECT (SELECT count(*) FROM old_cursor) AS cursors, (SELECT count(*) FROM moved_letters) AS letters
