-- DeleteOldEntries: up to @limit entries last written before @cutoff, oldest first,
-- skipping those being written.
DELETE FROM cached_outputs WHERE ctid IN (
    SELECT ctid FROM cached_outputs WHERE updated_at < @cutoff ORDER BY updated_at LIMIT @limit FOR UPDATE SKIP LOCKED)
