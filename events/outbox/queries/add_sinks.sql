-- AddSinks: gives each of @names that has no cursor one at the current end of the
-- outbox, as register_sinks.sql does, and notes that a replica is configured with each
-- (configured_at), which keeps a leader configured without it from removing it. It
-- removes nothing: any replica may run it at start, before it serves, so that no event
-- it acknowledges goes unqueued for a sink it is configured with, and again now and then
-- while it runs. It returns the names it added.
INSERT INTO cloudevent_sinks AS s (name, after_tx, after_position, after_ordinal)
SELECT DISTINCT name, pg_snapshot_xmin(pg_current_snapshot()), 0, 0
FROM unnest(@names::text[]) AS name
ON CONFLICT (name) DO UPDATE SET configured_at = now()
RETURNING name, xmax = 0 AS added
