-- AddSinks: gives each of @names that has no cursor one at the current end of the
-- outbox, as register_sinks.sql does, and removes nothing: any replica may run it at
-- start, before it serves, so that no event it acknowledges goes unqueued for a sink
-- it is configured with; which sinks are removed is the relay leader's call.
INSERT INTO cloudevent_sinks (name, after_tx, after_position, after_ordinal)
SELECT DISTINCT name, pg_snapshot_xmin(pg_current_snapshot()), 0, 0
FROM unnest(@names::text[]) AS name
ON CONFLICT (name) DO NOTHING
RETURNING name
