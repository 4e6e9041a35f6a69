-- +goose Up

-- One row per cached computation. The key's parts are columns, so entries can be listed
-- and invalidated per task or per cache version through the primary key's prefix.
CREATE TABLE cached_outputs (
    project        text        NOT NULL,
    domain         text        NOT NULL,
    task_name      text        NOT NULL,
    cache_version  text        NOT NULL,
    signature      text        NOT NULL,
    inputs_hash    text        NOT NULL,
    output_uri     text        NOT NULL,
    source_project text        NOT NULL,
    source_domain  text        NOT NULL,
    source_run     text        NOT NULL,
    source_action  text        NOT NULL,
    source_attempt integer     NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (project, domain, task_name, cache_version, signature, inputs_hash)
);
-- The entry TTL removes entries by age.
CREATE INDEX cached_outputs_by_age ON cached_outputs (updated_at);

-- One row per reserved computation: its holder may compute it until expires_at, and
-- extends it by heartbeating. previous_owner records whom the last write took it from.
CREATE TABLE reservations (
    project            text        NOT NULL,
    domain             text        NOT NULL,
    task_name          text        NOT NULL,
    cache_version      text        NOT NULL,
    signature          text        NOT NULL,
    inputs_hash        text        NOT NULL,
    owner_id           text        NOT NULL,
    previous_owner     text,
    heartbeat_interval interval    NOT NULL,
    expires_at         timestamptz NOT NULL,
    PRIMARY KEY (project, domain, task_name, cache_version, signature, inputs_hash)
);
CREATE INDEX reservations_by_expiry ON reservations (expires_at);

-- +goose Down
DROP TABLE reservations;
DROP TABLE cached_outputs;
