-- +goose Up

-- Every event ever recorded, keyed by its identity so that redelivery is absorbed.
-- The event itself is kept whole, protobuf-encoded; the key columns exist for lookups.
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

-- The latest state of each action, folded from its events in the same transaction that
-- records them. (attempt, rank, version, occurred_at, phase) orders states: a row is only
-- replaced by a state that is greater, so late or repeated events never move it back.
-- rank is the phase for non-terminal phases (they only move forward within an attempt)
-- and 5 for every terminal phase.
CREATE TABLE actions (
    id          bigint      GENERATED ALWAYS AS IDENTITY,
    project     text        NOT NULL,
    domain      text        NOT NULL,
    run         text        NOT NULL,
    action      text        NOT NULL,
    attempt     integer     NOT NULL,
    phase       smallint    NOT NULL,
    version     integer     NOT NULL,
    rank        smallint    NOT NULL,
    occurred_at timestamptz NOT NULL,
    created_at  timestamptz NOT NULL,
    event       bytea       NOT NULL, -- the event that set this state
    PRIMARY KEY (project, domain, run, action)
)
-- Room on each page for the new versions of updated rows, so updates stay on the page.
WITH (fillfactor = 70);

-- Listing is newest first by id, which is assigned once and never changes, so keyset
-- pages stay stable while actions progress.
CREATE INDEX actions_by_domain ON actions (project, domain, id DESC);
CREATE INDEX actions_by_run ON actions (project, domain, run, id DESC);
-- Retention finds old actions by created_at, which (unlike the state columns) almost
-- never changes, so updates of an action stay HOT: no index on the state columns.
CREATE INDEX actions_by_age ON actions (created_at);

-- +goose Down
DROP TABLE actions;
DROP TABLE action_events;
