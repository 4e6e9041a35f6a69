-- Trim: deletes up to @batch rows whose events every registered sink has passed: the
-- rows up to the lowest cursor, that row too once the cursor is at its last event; or,
-- when no sink is registered, every row (the greatest place possible is then the lowest).
-- Comparing (tx, position, count) with the cursor says both at once. The bound is
-- computed once (an InitPlan), and the batch's rows are picked down the primary key from
-- its start and deleted by their row addresses (a join back on the key would have
-- Postgres hash the whole outbox).
WITH lowest AS (
    SELECT after_tx AS tx, after_position AS position, after_ordinal AS ordinal FROM cloudevent_sinks
    UNION ALL
    SELECT '18446744073709551615'::xid8, 9223372036854775807, 2147483647
    ORDER BY 1, 2, 3
    LIMIT 1
)
DELETE FROM event_outbox
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM event_outbox
    WHERE (tx, position, count) <= ((SELECT tx FROM lowest), (SELECT position FROM lowest), (SELECT ordinal FROM lowest))
    ORDER BY tx, position
    LIMIT @batch
))
