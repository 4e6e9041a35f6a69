-- +flyte contract: works with code from version 17
-- +goose Up

-- The key of events by the name alone goes, each partition's part with it (00018 says
-- why and checked that it may): action_events_cluster_key (00016) is the key from here
-- on. With it goes v0.3.0's trigger that gave v0.2.0's events their action's cluster
-- (00017): only v0.2.0 wrote events without one. Catalog changes, under the runner's
-- lock_timeout.
ALTER TABLE action_events DROP CONSTRAINT action_events_pkey;
DROP TRIGGER IF EXISTS event_takes_its_actions_cluster ON action_events;
DROP FUNCTION IF EXISTS event_takes_its_actions_cluster();

-- +goose Down
-- Not reversed: a rollback is v0.3.0 running on this schema, which the marker allows.
