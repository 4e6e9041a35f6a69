-- +goose Up

-- The first step of partitioning action_events by filing time (00005 to 00010): every
-- step leaves a schema the previous release's events service keeps serving on, and no
-- step holds a lock that blocks its calls for longer than lock_timeout, so a migration
-- that cannot have its lock at once gives up (and is run again) instead of queueing
-- every call behind it. Scans and index builds run under no such lock.
--
-- An action's filing (store/partitions.go): the time it was first recorded, or last
-- re-filed by retention; its events live in the partition of its filing. The actions
-- there are filed at -infinity: in the partition holding everything from before
-- partitioning (00010). A constant default is kept in the catalog, not written to each
-- row, so the column is added without a rewrite, under a lock held only for the catalog
-- change. (The previous release's replicas name no filing: 00011 gives the new actions
-- they record theirs.)
SET LOCAL lock_timeout = '2s';
ALTER TABLE actions ADD COLUMN filed_at timestamptz NOT NULL DEFAULT '-infinity';

-- +goose Down
SET LOCAL lock_timeout = '2s';
-- Down undoes this file alone, before any code uses the column; squawk's rule is for
-- dropping what running code reads.
-- squawk-ignore ban-drop-column
ALTER TABLE actions DROP COLUMN filed_at;
