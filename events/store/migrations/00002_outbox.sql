-- +goose Up

-- The transactional outbox of CloudEvents egress (package events/outbox): every newly
-- stored action event is queued here, in the transaction that records it, for the relay
-- to publish to each configured sink.

-- The configured sinks, each with its cursor: it has handled every outbox entry up to
-- and including (after_tx, after_position). A new sink starts at the current end (see
-- events/outbox/queries/register_sinks.sql).
CREATE TABLE cloudevent_sinks (
    name           text        PRIMARY KEY,
    after_tx       xid8        NOT NULL,
    after_position bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Events waiting for the sinks. Entries are read in (tx, position) order and only once
-- their transaction has ended (events/outbox/queries/read.sql says why), so the primary
-- key is that order. The event is copied, not referenced: retention may delete it from
-- action_events before every sink has it.
--
-- Only the order of positions within one transaction matters, so the sequence could
-- hand each backend a cached range; measured with 8 writers, that made no difference to
-- Record's throughput, so positions stay in the order they were taken, which is simpler
-- to read.
CREATE TABLE event_outbox (
    position    bigint      GENERATED ALWAYS AS IDENTITY,
    tx          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    project     text        NOT NULL,
    domain      text        NOT NULL,
    run         text        NOT NULL,
    action      text        NOT NULL,
    attempt     integer     NOT NULL,
    phase       smallint    NOT NULL,
    version     integer     NOT NULL,
    occurred_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(), -- the recording transaction's start, for lag
    event       bytea       NOT NULL,
    PRIMARY KEY (tx, position)
)
-- A queue: rows are inserted and, once every sink has them, deleted, never updated.
-- Vacuum it after a fixed number of deletions rather than a fraction of its size, so
-- trimming from the front of the index does not walk long runs of dead entries.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);

-- Entries a sink refused for good (an HTTP 4xx other than 429, a message the broker will
-- never take), with what it said (detail, at most 2 KiB). Setting replay_requested_at asks
-- the relay to publish the entry again; it deletes the row when the sink takes it, and
-- records the new refusal otherwise. (sink, tx, position) is unique so that an entry
-- refused again after a restart (before its sink's cursor moved) counts as one more
-- attempt rather than a second row.
CREATE TABLE cloudevent_dead_letters (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink                text        NOT NULL,
    tx                  xid8        NOT NULL,
    position            bigint      NOT NULL,
    project             text        NOT NULL,
    domain              text        NOT NULL,
    run                 text        NOT NULL,
    action              text        NOT NULL,
    attempt             integer     NOT NULL,
    phase               smallint    NOT NULL,
    version             integer     NOT NULL,
    occurred_at         timestamptz NOT NULL,
    recorded_at         timestamptz NOT NULL,
    event               bytea       NOT NULL,
    detail              text        NOT NULL,
    failed_at           timestamptz NOT NULL DEFAULT now(),
    attempts            integer     NOT NULL DEFAULT 1,
    replay_requested_at timestamptz,
    UNIQUE (sink, tx, position)
);
-- Listing one sink's dead letters in id order.
CREATE INDEX cloudevent_dead_letters_by_sink ON cloudevent_dead_letters (sink, id);

-- Queues what a statement really inserted into action_events: the transition table holds
-- the rows COPY wrote, or those INSERT ... ON CONFLICT DO NOTHING did not absorb, so a
-- redelivered event is never queued twice. One call per statement, not per row. With no
-- sink configured the EXISTS is false once for the statement and nothing is read from
-- the transition table; Record then pays only for Postgres keeping it (not measurably:
-- 6.5 µs of backend CPU per event inserted without the trigger, 6.4 with it).
--
-- Positions are assigned in the order the statement inserted the rows, which a
-- transition table keeps. Record inserts a batch sorted by action and, within an action,
-- in the order its events fold (store.prepare), so one action's events of one batch are
-- read back in that order. The design had an ORDER BY here (by action, attempt, rank,
-- version, occurred_at, phase) to say so in SQL; it repeated Record's sort and cost a
-- third of what the outbox adds to an insert (backend CPU per event: 6.5 µs without the
-- trigger, 9.7 µs queueing without the sort, 11.2 µs with it). A test records a shuffled
-- batch and reads its events back in fold order.
-- +goose StatementBegin
CREATE FUNCTION queue_recorded_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (project, domain, run, action, attempt, phase, version, occurred_at, event)
    SELECT project, domain, run, action, attempt, phase, version, occurred_at, event
    FROM recorded
    WHERE EXISTS (SELECT FROM cloudevent_sinks);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER queue_recorded_events
    AFTER INSERT ON action_events
    REFERENCING NEW TABLE AS recorded
    FOR EACH STATEMENT EXECUTE FUNCTION queue_recorded_events();

-- +goose Down
DROP TRIGGER queue_recorded_events ON action_events;
DROP FUNCTION queue_recorded_events();
DROP TABLE cloudevent_dead_letters;
DROP TABLE event_outbox;
DROP TABLE cloudevent_sinks;
