-- Tables a crash left detached from action_events but not dropped: named as its
-- partitions are ($1 is the prefix's LIKE pattern), and partitions of nothing.
SELECT c.relname::text FROM pg_class c
WHERE c.relkind = 'r' AND NOT c.relispartition
  AND (c.relname LIKE $1 OR c.relname = 'action_events_before_partitioning')
  AND c.relnamespace = current_schema()::regnamespace
