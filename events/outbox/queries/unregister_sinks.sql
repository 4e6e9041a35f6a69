-- UnregisterSinks: removes the cursors of @names, an operator's explicit step
-- (--cloudevents-unregister-sink) for sinks taken out of every replica's configuration,
-- so that they stop holding trimming back at once rather than after the leader's
-- --cloudevents-forget-sink-after. Their dead letters stay. It returns the names removed.
DELETE FROM cloudevent_sinks WHERE name = ANY (@names::text[])
RETURNING name
