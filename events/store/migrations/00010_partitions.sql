-- +goose Up

-- action_events becomes a table partitioned by range of filed_at, so that retention
-- drops whole partitions instead of deleting rows (store/partitions.go), while the
-- previous release's replicas keep recording and reading through the same name.
--
-- Every event of an action carries its action's filing, so all of an action's events
-- share one partition, which a partition can go with once every action filed in it has
-- finished before the retention cutoff. The primary key must hold the partition key;
-- since an action's events all have the same filing, the event's identity alone still
-- decides whether an event is a redelivery.
--
-- The table as it was becomes the first partition, holding every filing before this
-- migration (all -infinity, 00005). It has the key (00007) and a validated check that
-- implies the partition's bound (00006, 00008), so attaching it builds and scans
-- nothing: the whole file is catalog changes, under one ACCESS EXCLUSIVE lock on the old
-- table held for milliseconds. Taken first, so that it is the only lock the file waits
-- for; lock_timeout makes it give up rather than queue every call behind it.
SET LOCAL lock_timeout = '2s';
LOCK TABLE action_events IN ACCESS EXCLUSIVE MODE;

ALTER TABLE action_events DROP CONSTRAINT action_events_pkey;
ALTER TABLE action_events ADD CONSTRAINT action_events_before_partitioning_pkey PRIMARY KEY USING INDEX action_events_filed_key;
DROP TRIGGER queue_recorded_events ON action_events; -- a partition cannot have it
-- The name the previous release uses goes to the partitioned table created below, so
-- no client loses it.
-- squawk-ignore renaming-table
ALTER TABLE action_events RENAME TO action_events_before_partitioning;

-- The previous release inserts events without a filing: they take the default,
-- infinity, and go to action_events_unfiled, below, until their transaction files them.
CREATE TABLE action_events (
    project     text        NOT NULL,
    domain      text        NOT NULL,
    run         text        NOT NULL,
    action      text        NOT NULL,
    -- The types are the old table's, which must match for it to be attached.
    -- squawk-ignore prefer-bigint-over-int
    attempt     integer     NOT NULL,
    -- squawk-ignore prefer-bigint-over-smallint
    phase       smallint    NOT NULL,
    -- squawk-ignore prefer-bigint-over-int
    version     integer     NOT NULL,
    occurred_at timestamptz NOT NULL,
    event       bytea       NOT NULL,
    filed_at    timestamptz NOT NULL DEFAULT 'infinity',
    PRIMARY KEY (project, domain, run, action, attempt, phase, version, filed_at)
) PARTITION BY RANGE (filed_at);

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER TABLE action_events ATTACH PARTITION action_events_before_partitioning FOR VALUES FROM (MINVALUE) TO (%L)', now());
END
$$;
-- +goose StatementEnd
-- The partition's bound says it now (and more: the store files actions at the newest
-- partition's end when no later one has been made yet).
ALTER TABLE action_events_before_partitioning DROP CONSTRAINT action_events_unpartitioned;

-- Where the previous release's events wait for their filing. A partition's row cannot
-- be given another one before it is routed (Postgres routes a row before any trigger
-- may change it), so they are filed when their transaction commits, by the deferred
-- trigger below: by then the previous release's Record has folded the events'
-- actions, as it does after inserting them, and so has filed a new action (by filed_at's
-- default: 00011) and locked an existing one, whose filing therefore stays put until
-- commit (retention's re-filing locks it first). Each event then goes to its action's
-- filing, or is absorbed there as a redelivery; nothing stays here once its transaction
-- has committed. Redeliveries thus never fail the previous release's copy, whose events
-- find nothing here to conflict with, and it locks actions before events from then on,
-- as the tree's Record does, so the two do not deadlock.
CREATE TABLE action_events_unfiled PARTITION OF action_events FOR VALUES FROM ('infinity') TO (MAXVALUE);

-- +goose StatementBegin
CREATE FUNCTION file_unfiled_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The transaction's first such event files them all, in the order Record sorts a
    -- batch in (by action, then in fold order), which the outbox keeps; the others find
    -- theirs gone.
    IF NOT EXISTS (SELECT FROM action_events_unfiled u
                   WHERE (u.project, u.domain, u.run, u.action, u.attempt, u.phase, u.version)
                       = (NEW.project, NEW.domain, NEW.run, NEW.action, NEW.attempt, NEW.phase, NEW.version)) THEN
        RETURN NULL;
    END IF;
    WITH unfiled AS (
        DELETE FROM action_events_unfiled RETURNING *
    )
    INSERT INTO action_events (project, domain, run, action, attempt, phase, version, occurred_at, event, filed_at)
    SELECT u.project, u.domain, u.run, u.action, u.attempt, u.phase, u.version, u.occurred_at, u.event,
           coalesce(a.filed_at, '-infinity')
    FROM unfiled u LEFT JOIN actions a USING (project, domain, run, action)
    ORDER BY u.project, u.domain, u.run, u.action, u.attempt, least(u.phase, 5), u.version, u.occurred_at, u.phase
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER file_unfiled_events
    AFTER INSERT ON action_events_unfiled
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION file_unfiled_events();

-- The outbox's trigger (00002) moves to the partitioned table. Unfiled events are
-- queued when they are filed, by the filing's insert, which queues only what it really
-- inserted: a redelivery is absorbed and not queued again, whichever release got it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION queue_recorded_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (count, events)
    SELECT count(*), array_agg(event)
    FROM recorded
    WHERE filed_at <> 'infinity' AND EXISTS (SELECT FROM cloudevent_sinks)
    HAVING count(*) > 0;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER queue_recorded_events
    AFTER INSERT ON action_events
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION queue_recorded_events();

-- +goose Down
-- Not reversed in place: the partitions made since cannot go back into one table under
-- a short lock. Restore the database from before the migration instead.
