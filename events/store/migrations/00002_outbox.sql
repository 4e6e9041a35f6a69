-- +goose Up

-- The transactional outbox of CloudEvents egress (package events/outbox): every newly
-- stored action event is queued here, in the transaction that records it, for the relay
-- to publish to each configured sink.

-- The configured sinks, each with its cursor: the sink has handled every event of the
-- outbox up to and including the after_ordinal-th (from 1) of the row at (after_tx,
-- after_position). A new sink starts at the current end (see events/outbox/queries/register_sinks.sql).
CREATE TABLE cloudevent_sinks (
    name           text        PRIMARY KEY,
    after_tx       xid8        NOT NULL,
    after_position bigint      NOT NULL,
    after_ordinal  integer     NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Events waiting for the sinks: one row per statement that recorded events, holding
-- them in the order the statement inserted them. Rows are read in (tx, position) order
-- and only once their transaction has ended (events/outbox/queries/read.sql says why), so
-- the primary key is that order. The events are copied, not referenced: retention may
-- delete them from action_events before every sink has them.
--
-- The design had a row per event, with the event's key columns. A row per statement
-- costs Postgres a heap tuple, an index entry and their WAL per Record instead of per
-- event. Backend CPU per event, inserting 500 events a statement: 7.0 µs without the
-- outbox, 10.1 µs queueing a row per event, 7.7 µs queueing a row per statement. The key
-- columns are not needed: every event carries its identity. The array is stored out of
-- line uncompressed: with 267-byte events, 10.0 µs without the outbox, 11.3 µs so, 14.7
-- µs compressed with pglz (the default), 11.1 µs with lz4 (which not every Postgres
-- build has).
CREATE TABLE event_outbox (
    position    bigint      GENERATED ALWAYS AS IDENTITY,
    tx          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    recorded_at timestamptz NOT NULL DEFAULT now(), -- the recording transaction's start, for lag
    count       integer     NOT NULL,               -- cardinality(events), read without the array
    events      bytea[]     NOT NULL,               -- protobuf-encoded ActionEvents
    PRIMARY KEY (tx, position)
)
-- A queue: rows are inserted and, once every sink has them, deleted, never updated.
-- Vacuum it after a fixed number of deletions rather than a fraction of its size, so
-- trimming from the front of the index does not walk long runs of dead entries.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
ALTER TABLE event_outbox ALTER COLUMN events SET STORAGE EXTERNAL;

-- Events a sink refused for good (an HTTP 4xx other than 429, a message the broker will
-- never take), with what it said (detail, at most 2 KiB). Setting replay_requested_at asks
-- the relay to publish the event again; it deletes the row when the sink takes it, and
-- records the new refusal otherwise. The key columns are the event's, for an operator's
-- queries; they are empty for an event whose bytes do not decode. (sink, tx, position,
-- ordinal) is unique so that an event refused again after a restart (before its sink's
-- cursor moved) counts as one more attempt rather than a second row.
CREATE TABLE cloudevent_dead_letters (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink                text        NOT NULL,
    tx                  xid8        NOT NULL,
    position            bigint      NOT NULL,
    ordinal             integer     NOT NULL,
    project             text        NOT NULL,
    domain              text        NOT NULL,
    run                 text        NOT NULL,
    action              text        NOT NULL,
    attempt             integer     NOT NULL,
    phase               smallint    NOT NULL,
    version             integer     NOT NULL,
    occurred_at         timestamptz,
    recorded_at         timestamptz NOT NULL,
    event               bytea       NOT NULL,
    detail              text        NOT NULL,
    failed_at           timestamptz NOT NULL DEFAULT now(),
    attempts            integer     NOT NULL DEFAULT 1,
    replay_requested_at timestamptz,
    UNIQUE (sink, tx, position, ordinal)
);
-- Listing one sink's dead letters in id order.
CREATE INDEX cloudevent_dead_letters_by_sink ON cloudevent_dead_letters (sink, id);

-- Queues what a statement really inserted into action_events: the transition table holds
-- the rows COPY wrote, or those INSERT ... ON CONFLICT DO NOTHING did not absorb, so a
-- redelivered event is never queued twice, and a statement that inserted nothing queues
-- no row. One call per statement, not per row. With no sink registered the EXISTS is
-- false once for the statement and nothing is read from the transition table; Record
-- then pays only for Postgres keeping it (not measurably).
--
-- The events keep the order the statement inserted them in, which a transition table
-- keeps. Record inserts a batch sorted by action and, within an action, in the order its
-- events fold (store.prepare), so one action's events of one batch are read back in that
-- order. The design sorted them here again (by action, attempt, rank, version,
-- occurred_at, phase) to say so in SQL; the sort repeated Record's and cost a third of
-- what a row per event added to an insert. A test records a shuffled batch and reads its
-- events back in fold order.
-- +goose StatementBegin
CREATE FUNCTION queue_recorded_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (count, events)
    SELECT count(*), array_agg(event)
    FROM recorded
    WHERE EXISTS (SELECT FROM cloudevent_sinks)
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
DROP TRIGGER queue_recorded_events ON action_events;
DROP FUNCTION queue_recorded_events();
DROP TABLE cloudevent_dead_letters;
DROP TABLE event_outbox;
DROP TABLE cloudevent_sinks;
