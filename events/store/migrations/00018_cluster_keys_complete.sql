-- +flyte contract: works with code from version 17
-- +goose Up

-- An action is its name and its cluster from here on: 00019 and 00020 drop the keys of
-- the name alone, which v0.2.0 wrote through and v0.3.0 (migrations 00012 to 00017)
-- kept for it, so that two clusters' actions of one name are two actions. v0.3.0's code
-- names the new keys and runs beside them (the marker above); v0.2.0's does not, and is
-- refused. Each is a file of its own, so that no file holds one table while it waits
-- for the other's lock.
--
-- This one checks that they may go. v0.3.0's partitions' maintenance has keyed every
-- partition with the cluster and given each action v0.2.0 recorded its cluster, in the
-- background (flyte_events_cluster_keys_complete is 1). A partition still without its
-- key that holds nothing (a new database's first ones) is keyed here, which on an empty
-- table takes no time; anything else left undone stops the migration, saying so,
-- rather than build an index or rewrite rows while holding the tables. It only reads
-- actions, through 00015's partial index.
-- +goose StatementBegin
DO $$
DECLARE
    part text;
    empty boolean;
    unkeyed text[];
BEGIN
    FOR part IN
        SELECT c.relname::text FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'action_events'::regclass AND NOT i.inhdetachpending
          AND NOT EXISTS (
              SELECT FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
              WHERE ii.inhparent = 'action_events_cluster_key'::regclass AND x.indrelid = c.oid)
        ORDER BY c.oid
    LOOP
        EXECUTE format('SELECT NOT EXISTS (SELECT FROM %I)', part) INTO STRICT empty;
        IF NOT empty THEN
            unkeyed := unkeyed || part;
            CONTINUE;
        END IF;
        EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON %I (project, domain, run, action, attempt, phase, version, filed_at, cluster) NULLS NOT DISTINCT',
                       part || '_cluster_key', part);
        EXECUTE format('ALTER INDEX action_events_cluster_key ATTACH PARTITION %I', part || '_cluster_key');
    END LOOP;
    IF unkeyed IS NOT NULL THEN
        RAISE EXCEPTION 'the events store is not ready for the keys with the cluster alone: partitions % have no key with the cluster yet; run v0.3.0''s events service until flyte_events_cluster_keys_complete is 1, then upgrade again (CHANGELOG.md, v0.3.0)', array_to_string(unkeyed, ', ');
    END IF;
    IF EXISTS (SELECT FROM actions WHERE cluster IS NULL) THEN
        RAISE EXCEPTION 'the events store is not ready for the keys with the cluster alone: actions recorded by v0.2.0 have no cluster yet; run v0.3.0''s events service until flyte_events_cluster_keys_complete is 1, then upgrade again (CHANGELOG.md, v0.3.0)';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Nothing to reverse: it changed only what an empty partition lacked.
