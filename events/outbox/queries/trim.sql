-- Trim: deletes up to @batch entries that every registered sink has passed: those up to
-- the lowest cursor, or, when no sink is registered, every entry (the greatest position
-- possible is then the lowest). The bound is computed once (an InitPlan), and the batch's
-- rows are picked down the primary key from its start and deleted by their row
-- addresses (a join back on the key would have Postgres hash the whole outbox).
WITH lowest AS (
    SELECT after_tx AS tx, after_position AS position FROM cloudevent_sinks
    UNION ALL
    SELECT '18446744073709551615'::xid8, 9223372036854775807
    ORDER BY 1, 2
    LIMIT 1
)
DELETE FROM event_outbox
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM event_outbox
    WHERE (tx, position) <= ((SELECT tx FROM lowest), (SELECT position FROM lowest))
    ORDER BY tx, position
    LIMIT @batch
))
