-- +goose Up

-- action_events becomes a table partitioned by range of filed_at, so that retention
-- drops whole partitions instead of deleting rows (store/partitions.go).
--
-- filed_at is the time an action was first recorded, or last re-filed by retention; every
-- event of an action carries its action's filed_at, so all of an action's events share
-- one partition, and a partition can go once every action filed in it has finished
-- before the retention cutoff. The primary key must hold the partition key; since an
-- action's events all have the same filed_at, the event's identity alone still decides
-- whether an event is a redelivery.
--
-- The table as it was becomes the first partition, holding every time before this
-- migration; its actions are filed at -infinity. The service makes the partitions for
-- the present and the next few before it serves (store.MaintainPartitions).
ALTER TABLE actions ADD COLUMN filed_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE actions ALTER COLUMN filed_at DROP DEFAULT;
-- Retention finds a partition's actions by filed_at, which changes only when retention
-- re-files an action, so updates of an action stay HOT. created_at is not searched any more.
DROP INDEX actions_by_age;
CREATE INDEX actions_by_filing ON actions (filed_at);

DROP TRIGGER queue_recorded_events ON action_events; -- a partition cannot have it
ALTER TABLE action_events RENAME TO action_events_before_partitioning;
ALTER TABLE action_events_before_partitioning DROP CONSTRAINT action_events_pkey;
ALTER TABLE action_events_before_partitioning ADD COLUMN filed_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE action_events_before_partitioning ALTER COLUMN filed_at DROP DEFAULT;

CREATE TABLE action_events (
    project     text        NOT NULL,
    domain      text        NOT NULL,
    run         text        NOT NULL,
    action      text        NOT NULL,
    attempt     integer     NOT NULL,
    phase       smallint    NOT NULL,
    version     integer     NOT NULL,
    occurred_at timestamptz NOT NULL,
    event       bytea       NOT NULL,
    filed_at    timestamptz NOT NULL,
    PRIMARY KEY (project, domain, run, action, attempt, phase, version, filed_at)
) PARTITION BY RANGE (filed_at);

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER TABLE action_events ATTACH PARTITION action_events_before_partitioning FOR VALUES FROM (MINVALUE) TO (%L)', now());
END
$$;
-- +goose StatementEnd

CREATE TRIGGER queue_recorded_events
    AFTER INSERT ON action_events
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION queue_recorded_events();

-- +goose Down
DROP TRIGGER queue_recorded_events ON action_events;
ALTER TABLE action_events RENAME TO action_events_partitioned;
CREATE TABLE action_events (
    project     text        NOT NULL,
    domain      text        NOT NULL,
    run         text        NOT NULL,
    action      text        NOT NULL,
    attempt     integer     NOT NULL,
    phase       smallint    NOT NULL,
    version     integer     NOT NULL,
    occurred_at timestamptz NOT NULL,
    event       bytea       NOT NULL,
    PRIMARY KEY (project, domain, run, action, attempt, phase, version)
);
INSERT INTO action_events
SELECT project, domain, run, action, attempt, phase, version, occurred_at, event FROM action_events_partitioned
ON CONFLICT DO NOTHING;
DROP TABLE action_events_partitioned;
CREATE TRIGGER queue_recorded_events
    AFTER INSERT ON action_events
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION queue_recorded_events();
DROP INDEX actions_by_filing;
ALTER TABLE actions DROP COLUMN filed_at;
CREATE INDEX actions_by_age ON actions (created_at);
