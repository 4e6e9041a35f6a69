-- +goose Up

-- While the previous release still serves beside this one, it records events without
-- the cluster (00013), of actions this release has given one: recorded, adopted or
-- back-filled. Such an event takes its action's cluster as it goes in, so that the next
-- release, once it drops the key of the name alone, absorbs its redelivery instead of
-- keeping it twice, and so that an event names no cluster only while its action names
-- none, which actions_without_cluster (00015) finds. Until then there is one action of a
-- name, which the function reads through the old key's index. This release's Record
-- names the cluster of every event, so the trigger's condition keeps the function off
-- its path. The next release's contract drops both.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION event_takes_its_actions_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT a.cluster INTO NEW.cluster FROM actions a
    WHERE (a.project, a.domain, a.run, a.action) = (NEW.project, NEW.domain, NEW.run, NEW.action);
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- A catalog change on the partitioned table and each partition, under the runner's
-- lock_timeout.
DROP TRIGGER IF EXISTS event_takes_its_actions_cluster ON action_events;
CREATE TRIGGER event_takes_its_actions_cluster
    BEFORE INSERT ON action_events
    FOR EACH ROW WHEN (NEW.cluster IS NULL)
    EXECUTE FUNCTION event_takes_its_actions_cluster();

-- +goose Down
DROP TRIGGER IF EXISTS event_takes_its_actions_cluster ON action_events;
DROP FUNCTION IF EXISTS event_takes_its_actions_cluster();
