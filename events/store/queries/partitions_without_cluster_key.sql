-- The partitions of action_events that have no index attached to
-- action_events_cluster_key (00016) yet, but for those being detached, which retention
-- drops. Oldest first, so that a partition made during a build waits its turn.
SELECT c.relname::text FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'action_events'::regclass AND NOT i.inhdetachpending
  AND NOT EXISTS (
      SELECT FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
      WHERE ii.inhparent = 'action_events_cluster_key'::regclass AND x.indrelid = c.oid)
ORDER BY c.oid
