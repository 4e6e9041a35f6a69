-- +goose Up

-- Validating the check scans action_events under SHARE UPDATE EXCLUSIVE, which blocks
-- no read or write, only other schema changes; so it has a transaction of its own, apart
-- from 00006's brief ACCESS EXCLUSIVE lock.
SET LOCAL lock_timeout = '2s';
ALTER TABLE action_events VALIDATE CONSTRAINT action_events_unpartitioned;

-- +goose Down
