-- ProjectUsage: each project's entries and the outputs' total size. One pass over the
-- table: eviction runs it once per interval, not per call.
SELECT project, count(*), coalesce(sum(output_bytes), 0)::bigint FROM cached_outputs GROUP BY project
