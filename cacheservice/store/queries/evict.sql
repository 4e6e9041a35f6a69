-- Evict: of @project's least recently used entries (last hit, or last written when
-- later), the fewest that take away at least @entries entries and @bytes bytes, at most
-- @limit, skipping those being written. Returns each deleted entry's size.
DELETE FROM cached_outputs WHERE ctid IN (
    SELECT ctid FROM (
        SELECT ctid, row_number() OVER w AS n, sum(output_bytes) OVER w - output_bytes AS freed_before
        FROM (
            SELECT ctid, output_bytes, greatest(updated_at, last_hit_at) AS used_at FROM cached_outputs
            WHERE project = @project
            ORDER BY greatest(updated_at, last_hit_at)
            LIMIT @limit
            FOR UPDATE SKIP LOCKED
        ) oldest
        WINDOW w AS (ORDER BY used_at, ctid ROWS UNBOUNDED PRECEDING)
    ) ranked
    WHERE n <= @entries OR freed_before < @bytes)
RETURNING output_bytes
