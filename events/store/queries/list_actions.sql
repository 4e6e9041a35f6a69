-- ListActions: a page of a domain's actions, newest first, before the cursor @before,
-- optionally of one run (@run), in one phase (@phase) and of one cluster (@cluster); NULL
-- leaves a filter out.
--
-- The store runs this unprepared, so that Postgres plans each call for its own filters:
-- a run's listing then walks actions_by_run and a domain's actions_by_domain. A generic
-- plan, made once for any parameters, walks actions_by_domain for a run too, through
-- every newer action of the domain: for an old run among 200,000 actions, 215 ms
-- instead of 0.2 ms.
--
-- At most @limit rows come from the index; of those, the page takes what fits the byte
-- budget (see list_action_events.sql, which pages the same way).
SELECT id, event, created_at FROM (
    SELECT id, event, created_at,
           sum(octet_length(event) + @item_overhead::integer) OVER w
               - (octet_length(event) + @item_overhead::integer) AS bytes_before,
           row_number() OVER w AS n
    FROM (
        SELECT id, event, created_at FROM actions
        WHERE project = @project AND domain = @domain
          AND (@run::text IS NULL OR run = @run::text)
          AND (@phase::smallint IS NULL OR phase = @phase::smallint)
          AND (@cluster::text IS NULL OR cluster = @cluster::text)
          AND id < @before
        ORDER BY id DESC
        LIMIT @limit
    ) limited
    WINDOW w AS (ORDER BY id DESC ROWS UNBOUNDED PRECEDING)
) page
WHERE n <= 2 OR bytes_before <= @max_bytes
ORDER BY id DESC
