-- +flyte contract: works with code from version 17
-- +goose Up

-- The key of actions by the name alone goes (00018 says why and checked that it may):
-- actions_cluster_key (00014), the name and the cluster, is the key from here on. A
-- catalog change, under the runner's lock_timeout.
ALTER TABLE actions DROP CONSTRAINT actions_pkey;

-- +goose Down
-- Not reversed: a rollback is v0.3.0 running on this schema, which the marker allows.
