-- Partitions: action_events' partitions with their ranges, oldest first. A range's
-- bounds are read back from Postgres's own text of them; the lower bound is NULL for
-- MINVALUE (the first partition, which holds every earlier filing). The partition ending
-- at MAXVALUE, action_events_unfiled, is not one of them: it holds the previous
-- release's events only until their transaction files them (migration 00010).
SELECT c.relname::text, i.inhdetachpending,
       CASE WHEN b[1] = 'MINVALUE' THEN NULL ELSE btrim(b[1], '''')::timestamptz END,
       btrim(b[2], '''')::timestamptz AS upper_bound
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid,
     regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \((.*)\) TO \((.*)\)') AS b
WHERE i.inhparent = 'action_events'::regclass AND b[2] <> 'MAXVALUE'
ORDER BY upper_bound
